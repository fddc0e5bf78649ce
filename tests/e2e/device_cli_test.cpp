// --device cpu|cuda|auto through the real binary (issue #8). The CPU-only tests run everywhere: on a machine
// without a usable GPU, auto falls back to the CPU with one info line and still reproduces the goldens, and
// cuda fails with one error line and exit 4 on every rank. The GPU tests (label cuda) check the goldens
// through the CUDA stage and skip themselves, with the reason, where no device exists: with and without
// CUDA graphs, the GPU's NUMA node in the placement, and (two GPUs or more) TP and PP over NCCL.
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/cuda/device.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/golden_run.h"
#include "tests/support/llama2c_export.h"
#include "tests/support/models.h"
#include "tests/support/process.h"

namespace shardline::test {
namespace {

constexpr const char* kModel = "mini-gqa.bin";

class Device : public GoldenCliTest {
 protected:
  static bool has_gpu() { return kernels::cuda::device_count().count > 0; }
};

TEST_F(Device, AutoWithoutAGpuRunsOnTheCpuSaysWhyOnceAndReproducesTheGoldens) {
  if (has_gpu()) GTEST_SKIP() << "this machine has a GPU: auto runs there (Device.CudaReproducesTheGoldens)";
  const ProcessResult r = run_process(golden_run(kModel, "--device auto"));
  expect_goldens(r, golden_.goldens, "--device auto");
  EXPECT_EQ(count_of(r.err, "--device auto: running on the CPU: no usable GPU ("), 1u) << r.err;
}

TEST_F(Device, AutoWithoutAGpuUnderMpirunSaysWhyOnceAndReproducesTheGoldens) {
  if (has_gpu()) GTEST_SKIP() << "this machine has a GPU: auto runs there";
  const ProcessResult r = run_process(mpirun(2) + golden_run(kModel, "--device auto --tp 2 --plan none"));
  expect_goldens(r, golden_.goldens, "mpirun -np 2 --device auto");
  EXPECT_EQ(count_of(r.err, "running on the CPU: no usable GPU ("), 1u) << r.err;
}

TEST_F(Device, AutoKeepsTheCpuForWhatTheCudaStageCannotRun) {
  // With or without a GPU: int8 weights run on the CPU only, so auto stays there and says why (it used to
  // pick the GPU and fail there).
  const ProcessResult r = run_process(golden_run(kModel, "--device auto --weights-dtype int8"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.err, "--device auto: running on the CPU: --weights-dtype int8 runs on the CPU only"), 1u) << r.err;
  expect_one_error_line(run_process(golden_run(kModel, "--device cuda --weights-dtype int8")), 2,
                        "--device cuda: --weights-dtype int8 runs on the CPU only");
}

TEST_F(Device, AutoKeepsTheCpuForATpRankWithoutHiddenFeatures) {
  // Hidden 32 is one block for two TP ranks: rank 0 holds none, which the CPU stage takes (its ordered sum
  // passes on) and the CUDA stage's all-reduce does not. auto stays on the CPU and says why; cuda is refused.
  const std::string model = path("narrow.bin");
  ASSERT_EQ(run_process(shardline_binary() + " gen-model --dim 64 --hidden 32 --layers 2 --heads 4 --vocab 300 "
                        "--seq 64 --out " + model).exit_code, 0);
  const std::string args = " run --steps 8 --prompt hi --tp 2 --pp 1 --plan none --model " + model;
  const ProcessResult r = run_process(mpirun(2) + shardline_binary() + args + " --device auto");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string reason = "hidden_dim 32 leaves some of tp=2 ranks no hidden features, which only the CPU stage takes";
  EXPECT_EQ(count_of(r.err, "--device auto: running on the CPU: " + reason), 1u) << r.err;
  expect_one_error_line(run_process(mpirun(2) + shardline_binary() + args + " --device cuda"), 2,
                        "--device cuda: " + reason);
}

TEST_F(Device, CpuIsTheCpuWithoutANotice) {
  const ProcessResult r = run_process(golden_run(kModel, "--device cpu"));
  expect_goldens(r, golden_.goldens, "--device cpu");
  EXPECT_EQ(r.err.find("running on the CPU"), std::string::npos) << r.err;
}

TEST_F(Device, CudaWithoutAGpuFailsWithOneLineAndExitCode4) {
  if (has_gpu()) GTEST_SKIP() << "this machine has a GPU";
  const ProcessResult r = run_process(golden_run(kModel, "--device cuda"));
  expect_one_error_line(r, 4, "--device cuda: no usable GPU (");
  EXPECT_NE(r.err.find("--device cpu"), std::string::npos) << "the line says what to do instead: " << r.err;
}

TEST_F(Device, CudaWithoutAGpuUnderMpirunFailsOnEveryRankWithOneLine) {
  if (has_gpu()) GTEST_SKIP() << "this machine has a GPU";
  const ProcessResult r = run_process(mpirun(2) + golden_run(kModel, "--device cuda --tp 2 --plan none"));
  expect_one_error_line(r, 4, "--device cuda: no usable GPU (");
}

TEST_F(Device, AnUnknownDeviceIsAConfigError) {
  const ProcessResult r = run_process(golden_run(kModel, "--device tpu"));
  expect_one_error_line(r, 2, "--device expects cpu, cuda or auto; got 'tpu'");
}

TEST_F(Device, PrintConfigShowsTheDevice) {
  const ProcessResult r = run_process(shardline_binary() + " run --print-config --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("device: cpu"), std::string::npos) << r.out;
}

// GPU only (label cuda): the CUDA stage reproduces the fp32 goldens. The CUDA matmuls sum in another order
// than the CPU's, so a greedy step whose top two logits tie within rounding could differ; the mini-gqa goldens
// have no such near-tie on the CPU backends.
class DeviceGpu : public CliTest {};

TEST_F(DeviceGpu, CudaReproducesTheGoldens) {
  const auto devices = kernels::cuda::device_count();
  if (devices.count == 0) GTEST_SKIP() << "no usable GPU: " << devices.reason;
  const GoldenRun golden = prepare_golden_run(kModel, path("prompts"));
  const ProcessResult r = run_process(shardline_binary() + " run " + golden.flags + " --device cuda");
  expect_goldens(r, golden.goldens, "--device cuda");
}

TEST_F(DeviceGpu, CudaRunsAQuantisedFileAsTheCheckpointOfItsDecodedValues) {
  // The CUDA stage's loader decodes a file's non-F32 tensors on the host, as the CPU's does: a llama2.c Q8_0
  // file (runq.c's) gives the logits of a legacy checkpoint of the values its codes decode to, bit for bit.
  const auto devices = kernels::cuda::device_count();
  if (devices.count == 0) GTEST_SKIP() << "no usable GPU: " << devices.reason;
  const std::string model = path("m.bin");
  ASSERT_EQ(run_process(shardline_binary() + " gen-model --dim 64 --hidden 168 --layers 2 --heads 4 --kv-heads 2 "
                        "--vocab 300 --seq 40 --unshared-classifier --out " + model).exit_code, 0);
  write_llama2c_export(model, path("q80.bin"), {.version = 2}, path("decoded.bin"));
  // Every step's logits of a run of `file`, on one GPU or (tp2) two.
  auto logits_of = [&](const std::string& file, bool tp2) {
    const ProcessResult r = run_process((tp2 ? mpirun(2) : std::string()) + shardline_binary() +
                                        " run --device cuda --steps 16 --prompt hello --tokenizer " +
                                        path("m.tokenizer.bin") + " --model " + file +
                                        (tp2 ? " --tp 2 --pp 1 --plan none" : "") + " --dump-logits " + path("l.f32"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(path("l.f32"), std::ios::binary);
    return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::vector<char> decoded = logits_of(path("decoded.bin"), false);
  EXPECT_EQ(decoded.size(), 16u * 300u * sizeof(float));
  EXPECT_EQ(logits_of(path("q80.bin"), false), decoded);
  // With two GPUs, TP ranks' row slices (q, k, v, w1, w3, the classifier) start inside the tensors.
  if (devices.count >= 2) {
    EXPECT_EQ(logits_of(path("q80.bin"), true), logits_of(path("decoded.bin"), true));
  }
}

TEST_F(DeviceGpu, CudaAppliesAGgufFilesRopeFrequencyFactorsAsTheCpuDoes) {
  // Llama 3.1's RoPE divisors (rope_freqs.weight): the CUDA stage's tokens are the CPU's, and not those of
  // the same file without them.
  const auto devices = kernels::cuda::device_count();
  if (devices.count == 0) GTEST_SKIP() << "no usable GPU: " << devices.reason;
  const std::string model = path("m.bin");
  ASSERT_EQ(run_process(shardline_binary() + " gen-model --dim 64 --hidden 160 --layers 2 --heads 4 --vocab 300 "
                        "--seq 64 --seed 6 --out " + model).exit_code, 0);
  const std::string tokenizer = path("m.tokenizer.bin");
  auto ids_of = [&](const std::string& file, const std::string& device) {
    const ProcessResult r = run_process(shardline_binary() + " run --json --steps 40 --prompt hi --device " + device +
                                        " --model " + file);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? nlohmann::json::parse(r.out)["ids"] : nlohmann::json();
  };
  llama_gguf_from_llama2c(model, tokenizer, {.rope_freqs = {8, 8, 4, 4, 2, 2, 1, 1}}).write(path("scaled.gguf"));
  llama_gguf_from_llama2c(model, tokenizer, {}).write(path("plain.gguf"));
  const nlohmann::json cpu = ids_of(path("scaled.gguf"), "cpu");
  EXPECT_EQ(ids_of(path("scaled.gguf"), "cuda"), cpu);
  EXPECT_NE(ids_of(path("plain.gguf"), "cuda"), cpu);
}

TEST_F(DeviceGpu, ARowPastTheInitialScoresScratchGrowsItAndKeepsTheCpusTokens) {
  // The attention scores' scratch starts at 4096 positions (not seq_len: a 128K context_length made it
  // gigabytes). A 3990-token prompt then 300 decode steps cross position 4096 after the decode step's CUDA
  // graph was captured: the grown scratch must drop that graph, whose stride is the old one. Same kernels
  // with and without graphs give the same bits; the CPU's tokens as in the tests above.
  const auto devices = kernels::cuda::device_count();
  if (devices.count == 0) GTEST_SKIP() << "no usable GPU: " << devices.reason;
  const std::string model = path("m.bin");
  ASSERT_EQ(run_process(shardline_binary() + " gen-model --dim 64 --hidden 160 --layers 2 --heads 4 --kv-heads 2 "
                        "--vocab 300 --seq 4608 --seed 9 --out " + model).exit_code, 0);
  std::string prompt;  // one token a character with this tokenizer: 3989 and the BOS
  for (int i = 0; i < 1330; ++i) prompt += std::string(i > 0 ? " " : "") + char('a' + i % 7) + char('b' + i % 5);
  {
    std::ofstream out(path("prompt.txt"));
    out << prompt << "\n";
  }
  auto run_ids = [&](const std::string& device_flags) {
    const ProcessResult r = run_process(shardline_binary() + " run --json --steps 300 --model " + model +
                                        " --prompts-file " + path("prompt.txt") + " " + device_flags);
    EXPECT_EQ(r.exit_code, 0) << device_flags << ": " << r.err;
    if (r.exit_code != 0) return nlohmann::json();
    const nlohmann::json j = nlohmann::json::parse(r.out);
    EXPECT_LT(j["prompt_ids"].size(), 4096u);
    EXPECT_GT(j["prompt_ids"].size() + j["ids"].size(), 4096u + 100u);
    return j["ids"];
  };
  const nlohmann::json graphs = run_ids("--device cuda --cuda-graphs on");
  EXPECT_EQ(run_ids("--device cuda --cuda-graphs off"), graphs);
  EXPECT_EQ(run_ids("--device cpu"), graphs);
}

// GPU only (label cuda): the issue #8 features through the real binary. Each skips with the reason where the
// machine lacks what it needs (a GPU; two for the NCCL layouts, as NCCL refuses two ranks on one GPU).
class DeviceGpuRuns : public Device {
 protected:
  void SetUp() override {
    Device::SetUp();
    devices_ = kernels::cuda::device_count().count;
    if (devices_ == 0) GTEST_SKIP() << "no usable GPU: " << kernels::cuda::device_count().reason;
  }
  void need_gpus(int n) {
    if (devices_ < n) GTEST_SKIP() << "needs " << n << " GPUs (one per rank), this machine has " << devices_;
  }
  int devices_ = 0;
};

TEST_F(DeviceGpuRuns, GraphsOnAndOffBothReproduceTheGoldens) {
  for (const std::string graphs : {"on", "off"}) {
    const ProcessResult r = run_process(golden_run(kModel, "--device cuda --cuda-graphs " + graphs));
    expect_goldens(r, golden_.goldens, "--cuda-graphs " + graphs);
  }
}

TEST_F(DeviceGpuRuns, VerbosePlacementNamesTheGpusNumaNode) {
  const ProcessResult r = run_process(shardline_binary() + " run -v --steps 4 --prompt Hello --device cuda --model " +
                                      model_file(kModel) + " --tokenizer " + model_file("tokenizer.bin"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Where hwloc knows the GPU: "GPU 0000:17:00.0 is on NUMA node 0"; else the documented fallback says why.
  const auto at = r.err.find("GPU placement: GPU ");
  ASSERT_NE(at, std::string::npos) << r.err;
  const std::string line = r.err.substr(at, r.err.find('\n', at) - at);
  const bool located = line.find(" is on NUMA node ") != std::string::npos;
  const bool explained = line.find("not among the") != std::string::npos || line.find("alike") != std::string::npos ||
                         line.find("no NUMA locality") != std::string::npos;
  EXPECT_TRUE(located || explained) << line;
}

TEST_F(DeviceGpuRuns, TensorParallelOverNcclReproducesTheGoldens) {
  need_gpus(2);
  const ProcessResult r = run_process(mpirun(2) + golden_run(kModel, "--device cuda --tp 2 --pp 1 --plan none"));
  expect_goldens(r, golden_.goldens, "mpirun -np 2 --device cuda --tp 2");
}

TEST_F(DeviceGpuRuns, PipelineStagesOverNcclReproduceTheGoldens) {
  need_gpus(2);
  // Several micro-batches, so stage 0 has sends in flight while it computes (its copies of the activations).
  const ProcessResult r =
      run_process(mpirun(2) + golden_run(kModel, "--device cuda --tp 1 --pp 2 --plan none --micro-batches 2"));
  expect_goldens(r, golden_.goldens, "mpirun -np 2 --device cuda --pp 2");
}

TEST_F(DeviceGpuRuns, LongPrefillChunksOverlapTheTpAllReducesAndMatchOneRank) {
  need_gpus(2);
  // Chunks of 128 rows: the CUDA stage splits them in two halves whose all-reduces overlap the other half.
  std::string prompt;
  for (int i = 0; i < 24; ++i) prompt += "Once upon a time there was a little robot. ";
  const std::string args = " run --json --steps 32 --chunk-tokens 128 --device cuda --model " + model_file(kModel) +
                           " --tokenizer " + model_file("tokenizer.bin") + " --prompt \"" + prompt + "\"";
  const ProcessResult one = run_process(shardline_binary() + args);
  const ProcessResult two = run_process(mpirun(2) + shardline_binary() + args + " --tp 2 --pp 1 --plan none");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(two.exit_code, 0) << two.err;
  const auto ids = [](const ProcessResult& r) { return nlohmann::json::parse(r.out)["ids"].get<std::vector<int>>(); };
  EXPECT_EQ(ids(two), ids(one));
  EXPECT_EQ(nlohmann::json::parse(one.out)["prompt_ids"].size() > 128, true) << "the prompt must fill a chunk";
}

}  // namespace
}  // namespace shardline::test
