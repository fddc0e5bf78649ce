// `shardline plan` and `shardline probe` as a user runs them: no MPI job and no weights for plan, real
// mpirun for probe, the JSON shape both write, and clear errors for what cannot work.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <tuple>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/cli_fixture.h"
#include "tests/support/models.h"
#include "tests/support/process.h"

namespace shardline::test {
namespace {

namespace fs = std::filesystem;

std::string cluster_file(const std::string& name) { return std::string(SHARDLINE_SOURCE_DIR) + "/hostfiles/" + name; }

class PlanCli : public CliTest {};

TEST_F(PlanCli, JsonHasEveryFieldTheIssueAsksFor) {
  const ProcessResult r = run_process(shardline_binary() + " plan --preset 110m --cluster " +
                                      cluster_file("cluster-2socket-100gbe.json") +
                                      " --objective throughput --batch 8 --context 1024 --top 3 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["plans"].size(), 3u);
  for (const char* key : {"tp", "pp", "layers_per_stage", "micro_batches", "chunk_tokens", "design_split_tokens",
                          "ttft_s", "throughput_tok_s", "token_latency_s", "bubble", "fractions", "stages", "feasible"}) {
    EXPECT_TRUE(j["plans"][0].contains(key)) << key;
  }
  const auto& best = j["plans"][0];
  int layers = 0;
  for (int n : best["layers_per_stage"]) layers += n;
  EXPECT_EQ(layers, 12);
  const auto& f = best["fractions"];
  EXPECT_NEAR(f["compute"].get<double>() + f["memory"].get<double>() + f["comm"].get<double>(), 1.0, 1e-9);
  EXPECT_GE(j["plans"][0]["throughput_tok_s"].get<double>(), j["plans"][1]["throughput_tok_s"].get<double>());
  EXPECT_EQ(j["workload"]["objective"], "throughput");
}

TEST_F(PlanCli, ReadsTheShapeFromACheckpointHeaderOnly) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.bin"));
  const ProcessResult r = run_process(shardline_binary() + " plan --model " + model_file("mini-gqa.bin") +
                                      " --cluster " + cluster_file("cluster-this-vm.json") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  for (const auto& plan : j["plans"]) EXPECT_EQ(2 % plan["tp"].get<int>(), 0) << "tp must divide 2 kv heads";
}

// --kv-dtype sizes the KV cache in the memory per rank: fp32 twice fp16's bytes.
TEST_F(PlanCli, KvDtypeSizesTheCache) {
  auto kv_bytes = [&](const std::string& kv) {
    const ProcessResult r = run_process(shardline_binary() +
                                        " plan --preset 110m --dtype int8 --tp 1 --pp 1 --top 1 --json --cluster " +
                                        cluster_file("cluster-this-vm.json") + " --kv-dtype " + kv);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    return std::pair(j["workload"]["kv_bytes_per_value"].get<double>(), j["plans"][0]["stages"][0]["kv_bytes"].get<double>());
  };
  const auto [fp16_value, fp16_bytes] = kv_bytes("fp16");
  const auto [fp32_value, fp32_bytes] = kv_bytes("fp32");
  EXPECT_EQ(fp16_value, 2.0);
  EXPECT_EQ(fp32_value, 4.0);
  EXPECT_GT(fp16_bytes, 0.0);
  EXPECT_DOUBLE_EQ(fp32_bytes, 2 * fp16_bytes);
  const ProcessResult bad = run_process(shardline_binary() + " plan --preset 110m --kv-dtype int4");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("unknown --kv-dtype 'int4'"), std::string::npos) << bad.err;
}

TEST_F(PlanCli, TemperatureSaysWhetherTheLastStageGathersTheLogits) {
  // tp = 2 on this VM's profile, batch 16: greedy decoding exchanges 8 bytes a row where sampling gathers 16
  // rows of 32000 logits, so the modelled decode step spends less time communicating.
  auto plan = [&](const std::string& temperature) {
    const ProcessResult r = run_process(shardline_binary() +
                                        " plan --preset 110m --dtype int8 --tp 2 --pp 1 --top 1 --json --objective "
                                        "throughput --batch 16 --cluster " +
                                        cluster_file("cluster-this-vm.json") + temperature);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const auto greedy = plan(""), sampled = plan(" --temperature 0.8");
  EXPECT_TRUE(greedy["workload"]["greedy"].get<bool>());
  EXPECT_FALSE(sampled["workload"]["greedy"].get<bool>());
  EXPECT_LT(greedy["plans"][0]["fractions"]["comm"].get<double>(), sampled["plans"][0]["fractions"]["comm"].get<double>());
  EXPECT_GT(greedy["plans"][0]["throughput_tok_s"].get<double>(), sampled["plans"][0]["throughput_tok_s"].get<double>());
  for (const char* value : {"-0.5", "inf", "nan"}) {  // as run refuses them
    const ProcessResult bad = run_process(shardline_binary() + " plan --preset 110m --temperature " + value);
    EXPECT_EQ(bad.exit_code, 2) << value << ": " << bad.err;
    EXPECT_NE(bad.err.find("--temperature must be a finite number >= 0"), std::string::npos) << bad.err;
  }
}

TEST_F(PlanCli, TableIsReadable) {
  const ProcessResult r = run_process(shardline_binary() + " plan --preset llama2-70b --dtype bf16 --cluster " +
                                      cluster_file("cluster-4node-8gpu-nvlink-ib.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* column : {"tp", "pp", "layers/stage", "TTFT", "tok/s", "mem/rank", "bubble", "comm%", "s*"}) {
    EXPECT_NE(r.out.find(column), std::string::npos) << column;
  }
}

TEST_F(PlanCli, ModelThatFitsNowhereExitsNonZeroNamingTheShortfall) {
  const ProcessResult r = run_process(shardline_binary() + " plan --preset llama2-70b --cluster " +
                                      cluster_file("cluster-this-vm.json"));
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("no layout fits"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("short"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stage"), std::string::npos) << r.err;
}

TEST_F(PlanCli, TheLargestBatchIsPlannedAtOnce) {
  // The throughput search doubles its micro-batch counts up to the batch: an int doubling past INT_MAX
  // wrapped negative and the search filled 17 GB before it ran out of memory.
  const ProcessResult r = run_process(shardline_binary() + " plan --preset 15m --objective throughput --batch 2147483647 "
                                      "--cluster " + cluster_file("cluster-this-vm.json"), 30);
  EXPECT_EQ(r.exit_code, 4) << r.err;  // its KV cache fits nowhere
  EXPECT_NE(r.err.find("no layout fits"), std::string::npos) << r.err;
}

TEST_F(PlanCli, MicroBatchesBeyondTheBatchArePlannedAndShownAsTheBatch) {
  // The cost model priced m = 3 of a batch of 1 as m = 1, but the table and JSON said 3 (with m = 1's bubble).
  const ProcessResult r = run_process(shardline_binary() + " plan --preset 110m --tp 2 --pp 4 --micro-batches 3,4 "
                                      "--batch 1 --json --cluster " + cluster_file("cluster-2socket-100gbe.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json plans = nlohmann::json::parse(r.out)["plans"];
  ASSERT_EQ(plans.size(), 1u) << r.out;  // 3 and 4 are one plan, not two copies
  EXPECT_EQ(plans[0]["micro_batches"], 1) << r.out;
  EXPECT_NE(r.err.find("--micro-batches 3 is more than --batch 1: planned as 1"), std::string::npos) << r.err;
  const ProcessResult zero = run_process(shardline_binary() + " plan --preset 110m --micro-batches 0 --cluster " +
                                         cluster_file("cluster-2socket-100gbe.json"));
  EXPECT_EQ(zero.exit_code, 2);
  EXPECT_NE(zero.err.find("--micro-batches 0 is not a count >= 1"), std::string::npos) << zero.err;
}

TEST_F(PlanCli, TakesRunsNameForTheWeightDtype) {
  // run calls it --weights-dtype, plan --dtype: a plan copied from a run's flags takes either.
  const std::string plan = shardline_binary() + " plan --preset 110m --top 2 --json --cluster " +
                           cluster_file("cluster-2socket-100gbe.json");
  const ProcessResult by_plan = run_process(plan + " --dtype int8");
  const ProcessResult by_run = run_process(plan + " --weights-dtype int8");
  ASSERT_EQ(by_run.exit_code, 0) << by_run.err;
  EXPECT_EQ(by_run.out, by_plan.out);
  EXPECT_NE(by_run.out, run_process(plan).out);  // and it is not ignored
}

TEST_F(PlanCli, BadInputsAreClearErrors) {
  const std::string bad = (dir_ / "bad.json").string();
  std::ofstream(bad) << R"({"nodes": 2, "domains_per_node": 1, "domain": {"cores": 4}, "links": {}})";
  ProcessResult r = run_process(shardline_binary() + " plan --preset 110m --cluster " + bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("memory_bytes"), std::string::npos) << r.err;
  std::ofstream(bad) << "{ not json";
  r = run_process(shardline_binary() + " plan --preset 110m --cluster " + bad);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  std::ofstream(bad) << R"({"nodes": 1e999})";  // beyond a double: nlohmann's out_of_range, once "unexpected"
  r = run_process(shardline_binary() + " plan --preset 110m --cluster " + bad);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("bad.json' is not valid JSON: number overflow parsing '1e999'"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("[json.exception"), std::string::npos) << "the library's tag says nothing to a user: " << r.err;
  // What nlohmann takes silently: a key given twice (the last won) and bytes after a NUL (ignored).
  const std::string good = cluster_file("cluster-this-vm.json");
  std::ifstream in(good);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(bad, std::ios::trunc) << "{\"nodes\": 0, " << text.substr(text.find('{') + 1);
  r = run_process(shardline_binary() + " plan --preset 110m --cluster " + bad);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("gives the key 'nodes' twice in one object"), std::string::npos) << r.err;
  std::ofstream(bad, std::ios::trunc | std::ios::binary) << text << std::string(1, '\0') << "garbage {{{";
  r = run_process(shardline_binary() + " plan --preset 110m --cluster " + bad);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("holds a NUL byte at offset"), std::string::npos) << r.err;
  r = run_process(shardline_binary() + " plan --preset gpt-9 --cluster " + cluster_file("cluster-this-vm.json"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("known: 15m"), std::string::npos) << r.err;
  r = run_process(shardline_binary() + " plan --preset 110m --np 99 --cluster " + cluster_file("cluster-this-vm.json"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--np 99"), std::string::npos) << r.err;
  // A --tp the model cannot take: the error names the filter, not only the model.
  r = run_process(shardline_binary() + " plan --preset 15m --tp 4 --cluster " + cluster_file("cluster-2socket-100gbe.json"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("with --tp 4"), std::string::npos) << r.err;
  // Filters that need more ranks than --np gives: that is the reason, not the model's divisibility rules.
  r = run_process(shardline_binary() + " plan --preset 15m --np 2 --tp 2 --pp 2 --cluster " +
                  cluster_file("cluster-2socket-100gbe.json"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("no layout with --tp 2 and --pp 2 fits 2 ranks: the smallest it allows needs 4"),
            std::string::npos) << r.err;
  r = run_process(shardline_binary() + " plan --preset 15m --np 3 --tp 2 --cluster " + cluster_file("cluster-2socket-100gbe.json"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("no layout with --tp 2 uses exactly 3 ranks: tp x pp must equal the rank count"), std::string::npos)
      << r.err;
  for (const char* flag : {"--np -1", "--top 0", "--context -5", "--context 1", "--prompt-tokens -1", "--ranks-per-domain -2",
                           "--tp ''", "--pp ''", "--micro-batches ''"}) {  // an empty list is no filter to drop
    r = run_process(shardline_binary() + " plan --preset 110m " + flag + " --cluster " + cluster_file("cluster-this-vm.json"));
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.err;
    EXPECT_NE(r.err.find(std::string(flag).substr(0, std::string(flag).find(' '))), std::string::npos) << r.err;
  }
  // Blanks around a list's items are read past on both sides, as typed ("1, 2") or pasted ("2 "); a blank
  // item is still no number.
  r = run_process(shardline_binary() + " plan --preset 110m --np 2 --tp ' 2 ' --pp '1 ' --json --cluster " +
                  cluster_file("cluster-this-vm.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& plan : nlohmann::json::parse(r.out)["plans"]) EXPECT_EQ(plan["tp"], 2) << plan;
  for (const char* flag : {"--tp ' '", "--tp '1, ,2'", "--tp '1 2'"}) {
    r = run_process(shardline_binary() + " plan --preset 110m " + flag + " --cluster " + cluster_file("cluster-this-vm.json"));
    EXPECT_EQ(r.exit_code, 2) << flag << ": " << r.err;
    EXPECT_NE(r.err.find("--tp expects comma-separated integers"), std::string::npos) << r.err;
  }
  // So is white space around a number flag's value, in every command ("--np ' 2'" and "--tp ' 2'" were
  // refused where "--tp ' 2, 4'" was not); a blank value is still no number, and says what it takes.
  r = run_process(shardline_binary() + " plan --preset 110m --np ' 2' --tp '2\t' --top '1 ' --cluster " +
                  cluster_file("cluster-this-vm.json"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_process(shardline_binary() + " launch-check --tp ' 2' --pp '1 ' --np 2");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const std::string command : {"plan --preset 110m --top ' '", "launch-check --tp 2.5 --pp 1"}) {
    r = run_process(shardline_binary() + " " + command);
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.err;
    EXPECT_NE(r.err.find("it takes a whole number"), std::string::npos) << command << ": " << r.err;
  }
  r = run_process(shardline_binary() + " probe --quick --out ''");  // a bad flag (2), not a file system error (4)
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("the --out file name is empty"), std::string::npos) << r.err;
}

// --dtype plans at the weight format's own rates where the cluster file gives them: this VM's int8 kernels
// multiply 7x faster than its fp32 ones, which makes batch 16 of the 110M shape bound by bandwidth, not
// by fp32's FLOP rate.
TEST_F(PlanCli, WeightFormatsPlanAtTheirOwnRates) {
  auto throughput = [&](const std::string& cluster) {
    const ProcessResult r = run_process(shardline_binary() + " plan --preset 110m --dtype int8 --batch 16 --context 64 "
                                        "--objective throughput --np 1 --top 1 --json --cluster " + cluster);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["plans"][0]["throughput_tok_s"].get<double>();
  };
  std::ifstream in(cluster_file("cluster-this-vm.json"));
  auto j = nlohmann::json::parse(in);
  ASSERT_TRUE(j["domain"].contains("formats"));
  j["domain"].erase("formats");
  const std::string without = (dir_ / "no-formats.json").string();
  std::ofstream(without) << j.dump();
  EXPECT_GT(throughput(cluster_file("cluster-this-vm.json")), 2 * throughput(without));
}

TEST_F(PlanCli, SmallModelsShowTheirParametersInMillions) {
  const ProcessResult r = run_process(shardline_binary() + " plan --preset 15m --cluster " + cluster_file("cluster-this-vm.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("M params"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("0.00B"), std::string::npos) << r.out;
}

TEST_F(PlanCli, EmittedSbatchHoldsTheGeometryAndNoInjectedLines) {
  // A cluster name with a newline: its comment line must not become a shell line of the script.
  nlohmann::json cluster;
  std::ifstream(cluster_file("cluster-this-vm.json")) >> cluster;
  cluster["name"] = "evil\nrm -rf /tmp/never";
  const std::string path = (dir_ / "evil.json").string();
  std::ofstream(path) << cluster.dump();
  const ProcessResult r = run_process(shardline_binary() + " plan --preset 15m --np 2 --emit sbatch --cluster " + path);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("\nrm -rf"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("evil rm -rf /tmp/never"), std::string::npos) << r.out;
  // The table's header and the --np error quote the name escaped (a fuzzing pass: a terminal escape, a
  // newline and a NUL reached stdout as they were).
  cluster["name"] = std::string("\x1b[31mRED\nline2\0nul", 18);
  std::ofstream(path) << cluster.dump();
  const ProcessResult table = run_process(shardline_binary() + " plan --preset 15m --np 2 --cluster " + path);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_EQ(table.out.find('\x1b'), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find(std::string(1, '\0')), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("on '\\x1b[31mRED\\x0aline2\\x00nul'"), std::string::npos) << table.out;
  const ProcessResult too_many = run_process(shardline_binary() + " plan --preset 15m --np 99999 --cluster " + path);
  EXPECT_EQ(too_many.exit_code, 2) << too_many.err;
  EXPECT_EQ(too_many.err.find('\x1b'), std::string::npos) << too_many.err;
  // A plan of fewer ranks than a domain's slots gives each its share of the cores the plan priced (the
  // cluster's 2 slots on 2 cores: one rank gets both), and overcommits only when its ranks outnumber them.
  const std::string vm = shardline_binary() + " plan --preset 15m --emit sbatch --cluster " + cluster_file("cluster-this-vm.json");
  for (const char* alone : {" --np 1", " --np 1 --ranks-per-domain 3"}) {
    const ProcessResult one = run_process(vm + alone);
    ASSERT_EQ(one.exit_code, 0) << one.err;
    EXPECT_NE(one.out.find("#SBATCH --cpus-per-task=2 "), std::string::npos) << alone << "\n" << one.out;
    EXPECT_EQ(one.out.find("overcommit"), std::string::npos) << alone << "\n" << one.out;
  }
  // The plan's ranks per node, and srun told the cores per task (Slurm 22.05's srun does not inherit them).
  EXPECT_NE(r.out.find("#SBATCH --ntasks-per-node=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("srun --mpi=pmix --cpus-per-task=\"${SLURM_CPUS_PER_TASK:-1}\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("#SBATCH --time=01:00:00 "), std::string::npos) << r.out;
  // --time sets the limit (an hour stays pending on a partition whose MaxTime is shorter); only Slurm's
  // characters may reach the #SBATCH line.
  const std::string plain = shardline_binary() + " plan --preset 15m --np 2 --cluster " + cluster_file("cluster-this-vm.json");
  const ProcessResult short_job = run_process(plain + " --emit sbatch --time 00:05:00");
  ASSERT_EQ(short_job.exit_code, 0) << short_job.err;
  EXPECT_NE(short_job.out.find("#SBATCH --time=00:05:00 "), std::string::npos) << short_job.out;
  for (const char* ok : {"30", "1-12:30", "UNLIMITED", "unlimited", "Infinite", "-1"}) {  // Slurm's time_str2secs
    EXPECT_EQ(run_process(plain + " --emit sbatch --time " + ok).exit_code, 0) << ok;
  }
  for (const char* bad : {" --emit sbatch --time '5;rm -rf x'", " --emit sbatch --time ''", " --emit sbatch --time :::",
                          " --emit sbatch --time=-5", " --time 5", " --emit sbatch --json"}) {
    const ProcessResult refused = run_process(plain + bad);
    EXPECT_EQ(refused.exit_code, 2) << bad << ": " << refused.err;
    EXPECT_EQ(refused.out, "") << bad;
  }
}

TEST_F(PlanCli, AGpuClustersScriptAsksForTheGpusAndTheKvCacheThePlanPriced) {
  // The example GPU cluster says "device": "cuda": the plan prices the CUDA stage's fp32 KV cache, and the
  // script asks Slurm for each node's GPUs and run for --device cuda (auto would fall back to the CPU).
  const std::string gpu = shardline_binary() + " plan --preset llama2-7b --cluster " +
                          cluster_file("cluster-4node-8gpu-nvlink-ib.json");
  const ProcessResult r = run_process(gpu + " --np 16 --tp 8 --pp 2 --dtype bf16 --emit sbatch");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("#SBATCH --nodes=2 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("#SBATCH --ntasks-per-node=8 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("#SBATCH --gres=gpu:8 "), std::string::npos) << r.out;
  EXPECT_EQ(count_of(r.out, "--weights-dtype bf16 --kv-dtype fp32 --device cuda"), 2u) << r.out;  // check and run
  // A job on fewer GPUs than a node has asks for the ones it uses.
  const ProcessResult small = run_process(gpu + " --np 2 --tp 2 --pp 1 --emit sbatch");
  ASSERT_EQ(small.exit_code, 0) << small.err;
  EXPECT_NE(small.out.find("#SBATCH --gres=gpu:2 "), std::string::npos) << small.out;
  // The same dtype on a CPU cluster names the one auto resolved to there (not "auto", which a node of
  // another CPU could resolve to a larger cache than the plan priced), and asks for no GPU.
  const ProcessResult cpu = run_process(shardline_binary() + " plan --preset 15m --np 2 --dtype bf16 --emit sbatch "
                                        "--cluster " + cluster_file("cluster-this-vm.json"));
  ASSERT_EQ(cpu.exit_code, 0) << cpu.err;
  EXPECT_EQ(cpu.out.find("--kv-dtype auto"), std::string::npos) << cpu.out;
  EXPECT_EQ(cpu.out.find("gres"), std::string::npos) << cpu.out;
  EXPECT_EQ(cpu.out.find("--device"), std::string::npos) << cpu.out;
  // run gives each rank the GPU of its local rank: a plan of several ranks per GPU has no script.
  const ProcessResult shared = run_process(gpu + " --ranks-per-domain 4 --np 16 --tp 8 --pp 2 --emit sbatch");
  EXPECT_EQ(shared.exit_code, 2) << shared.err;
  EXPECT_NE(shared.err.find("needs one rank per GPU"), std::string::npos) << shared.err;
  // What the CUDA stage cannot hold is refused before planning, naming the cluster's device (exit 2).
  for (const char* bad : {" --dtype int8", " --kv-dtype fp16", " --kv-dtype int8"}) {
    const ProcessResult refused = run_process(gpu + bad);
    EXPECT_EQ(refused.exit_code, 2) << bad << ": " << refused.err;
    EXPECT_NE(refused.err.find("runs on GPUs (\"device\": \"cuda\")"), std::string::npos) << refused.err;
    EXPECT_EQ(refused.out, "") << bad;
  }
}

TEST_F(PlanCli, AClusterDeviceOtherThanCpuOrCudaIsRefused) {
  nlohmann::json cluster;
  std::ifstream(cluster_file("cluster-this-vm.json")) >> cluster;
  for (const nlohmann::json& device : {nlohmann::json("gpu"), nlohmann::json(1), nlohmann::json("CUDA")}) {
    cluster["device"] = device;
    const std::string path = (dir_ / "device.json").string();
    std::ofstream(path) << cluster.dump();
    const ProcessResult r = run_process(shardline_binary() + " plan --preset 15m --cluster " + path);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("cluster.device must be \"cpu\" or \"cuda\""), std::string::npos) << r.err;
  }
}

TEST_F(PlanCli, ProbeRefusesAnUnwritableOutBeforeMeasuring) {
  // It used to measure for seconds and then say only "cannot write"; a test of the time would be a timed
  // test, so the measurement's own output (its table on stdout) is what must be absent.
  for (const auto& [out, reason] : std::vector<std::pair<std::string, std::string>>{
           {(dir_ / "no-such-folder" / "p.json").string(), "No such file or directory"}, {dir_.string(), "Is a directory"}}) {
    const ProcessResult r = run_process(shardline_binary() + " probe --quick --out " + out, 60);
    EXPECT_EQ(r.exit_code, 4) << r.err;
    EXPECT_NE(r.err.find("cannot write --out file '" + out + "': " + reason), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  // A FIFO nobody reads: opening it for writing waited for a reader forever.
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const ProcessResult r = run_process(shardline_binary() + " probe --quick --out " + fifo, 60);
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("cannot write --out file '" + fifo + "': a FIFO that nobody reads"), std::string::npos) << r.err;
}

TEST_F(PlanCli, ProbeUnderMpirunSaysABadFlagOnceWithItsExitCode) {
  // Every rank printed its own "[r0] error: ... unknown flag" line and aborted the job its own way.
  for (const auto& [flags, code, expect] : std::vector<std::tuple<std::string, int, std::string>>{
           {"--quick --bogus", 2, "unknown flag '--bogus'"},
           {"--quick --out " + (dir_ / "no-such-folder" / "p.json").string(), 4, "cannot write --out file"},
           // Ranks measuring differently exchanged messages of other sizes ("MPI_ERR_TRUNCATE", exit 5).
           {"--quick --out " + (dir_ / "p.json").string() + " : -np 2 " + shardline_binary() + " probe --out " +
                (dir_ / "p.json").string(),
            2, "[r1] error: rank 0's --quick differs from every other rank's ('given' on rank 0, 'not given' on rank 1 and "
               "the rest)"}}) {
    const std::string np = flags.find(" : ") == std::string::npos ? "3 " : "1 ";
    const ProcessResult r =
        run_process("mpirun --oversubscribe --bind-to none -np " + np + shardline_binary() + " probe " + flags, 60);
    EXPECT_EQ(r.exit_code, code) << r.err;
    std::size_t lines = 0;
    for (std::size_t at = r.err.find(expect); at != std::string::npos; at = r.err.find(expect, at + 1)) ++lines;
    EXPECT_EQ(lines, 1u) << r.err;
    EXPECT_EQ(r.err.find("MPI_ABORT"), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

TEST_F(PlanCli, ProbeUnderMpirunWritesAProfileThatPlanReads) {
  const std::string out = (dir_ / "probe.json").string();
  const ProcessResult probe =
      run_process("mpirun --oversubscribe --bind-to none -np 2 " + shardline_binary() + " probe --quick --out " + out, 120);
  ASSERT_EQ(probe.exit_code, 0) << probe.err;
  EXPECT_NE(probe.out.find("same host (point-to-point)"), std::string::npos) << probe.out;
  std::ifstream in(out);
  const auto j = nlohmann::json::parse(in);
  EXPECT_TRUE(j["measurements"]["point_to_point"]["same_host"]["measured"].get<bool>());
  EXPECT_FALSE(j["measurements"]["point_to_point"]["cross_host"]["measured"].get<bool>());  // one host here
  EXPECT_GT(j["domain"]["core_bandwidth_bytes_per_s"].get<double>(), 1e8);
  EXPECT_GT(j["links"]["same_domain"]["bandwidth_bytes_per_s"].get<double>(), 1e7);
  // Each weight format's own rates, and the fixed costs the cost model charges per pass and per row.
  for (const char* format : {"bf16", "int8"}) {
    EXPECT_GT(j["domain"]["formats"][format]["core_flops"].get<double>(), 1e8) << format;
    EXPECT_GT(j["domain"]["formats"][format]["core_bandwidth_bytes_per_s"].get<double>(), 1e8) << format;
    EXPECT_GT(j["domain"]["formats"][format]["row_element_s"].get<double>(), 0) << format;
  }
  EXPECT_GE(j["domain"]["step_overhead_s"].get<double>(), 0);
  EXPECT_GT(j["domain"]["row_element_s"].get<double>(), 0);
  EXPECT_GT(j["domain"]["attention_head_s"].get<double>(), 0);
  EXPECT_GE(j["domain"]["attention_rows"].get<int>(), 1);
  EXPECT_GT(j["domain"]["attention_flops"].get<double>(), 1e8);
  EXPECT_GT(j["domain"]["small_batch_flops"].get<double>(), 1e8);
  EXPECT_GE(j["domain"]["overlap_loss"].get<double>(), 0);
  EXPECT_LE(j["domain"]["overlap_loss"].get<double>(), 1);
  EXPECT_NE(probe.out.find("int8"), std::string::npos) << probe.out;
  const ProcessResult plan = run_process(shardline_binary() + " plan --preset 110m --np 2 --probe-file " + out);
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
}

}  // namespace
}  // namespace shardline::test
