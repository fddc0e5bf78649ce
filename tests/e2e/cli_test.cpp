// The `shardline` CLI as a user runs it: goldens through --json, the plain text output, mpirun -np 1,
// the built-in default model, and one clear error line with a meaningful exit code for each bad input.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <regex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "kernels/cpu/weight_format.h"
#include "memory/system_memory.h"
#include "runtime/checkpoint.h"
#include "runtime/gguf.h"
#include "runtime/model_generator.h"
#include "runtime/tokenizer.h"
#include "tests/support/byte_level_vocab.h"
#include "tests/support/cli_fixture.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/models.h"
#include "tests/support/process.h"

namespace shardline::test {
namespace {

namespace fs = std::filesystem;

const std::string kMpirun = "mpirun --oversubscribe -np ";

std::string shardline() { return shardline_binary(); }

class Cli : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    setenv("SHARDLINE_CACHE_DIR", (dir_ / "cache").c_str(), 1);
  }

  // A run that must fail: the exit code, exactly one line on stderr, that line says "error:" and contains
  // `expect`, and nothing crashed on the way.
  void expect_clean_failure(const std::string& args, int exit_code, const std::string& expect) {
    const ProcessResult r = run_process(shardline() + " " + args, 60);
    EXPECT_EQ(r.exit_code, exit_code) << args << "\nstderr: " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find("error:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(expect), std::string::npos) << "expected '" << expect << "' in: " << r.err;
    EXPECT_EQ(r.err.find("terminate called"), std::string::npos) << r.err;
  }

  std::string copy_prefix(const std::string& from, std::uintmax_t bytes, const std::string& name) {
    std::ifstream in(from, std::ios::binary);
    std::vector<char> data(bytes);
    in.read(data.data(), static_cast<std::streamsize>(bytes));
    std::ofstream(path(name), std::ios::binary).write(data.data(), static_cast<std::streamsize>(bytes));
    return path(name);
  }
};

nlohmann::json parse_single_json(const std::string& out) {
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  return nlohmann::json::parse(out);
}

// The names of the files in dir.
std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  return names;
}

// A bash script that starts `gen-model --preset 15m --out dir/m.bin`, waits for its part file to show, runs
// `interrupt` on it ($pid), then `when_caught` if the part file is still there (the writer was caught mid-
// write) and exits, else `otherwise`, and tries again (at most five times, then it prints 'never caught
// mid-write'): a loaded machine cannot let the writer finish first and fail the test.
std::string gen_model_caught_mid_write(const std::string& dir, const std::string& interrupt,
                                       const std::string& when_caught, const std::string& otherwise) {
  return "for attempt in 1 2 3 4 5; do " + shardline() + " gen-model --preset 15m --out " + dir +
         "/m.bin 2>/dev/null & pid=$!; "
         "for i in $(seq 2000); do ls " + dir + " | grep -q 'm.bin.tmp' && break; sleep 0.005; done; " + interrupt +
         "; if ls " + dir + " | grep -q 'm.bin.tmp'; then " + when_caught + "; exit; fi; " + otherwise + "; rm -f " +
         dir + "/*; done; echo 'never caught mid-write'";
}

TEST_F(Cli, JsonOutputReproducesEveryGolden) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("goldens.jsonl"));
  for (const auto& golden : load_goldens()) {
    SHARDLINE_REQUIRE_MODEL_FILE(model_file(golden.model));
    const ProcessResult r =
        run_process(shardline() + " run --json --threads 1 --model " + model_file(golden.model) + " --tokenizer " +
                    model_file("tokenizer.bin") + " --steps " + std::to_string(golden.steps) + " --prompt " +
                    shell_quote(golden.prompt));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = parse_single_json(r.out);
    EXPECT_EQ(j["prompt"], golden.prompt);
    EXPECT_EQ(j["prompt_ids"].get<std::vector<int>>(), golden.prompt_ids) << golden.model << " " << golden.prompt;
    EXPECT_EQ(j["ids"].get<std::vector<int>>(), golden.ids) << golden.model << " " << golden.prompt;
  }
}

// U+2028 and U+2029 are valid raw in JSON, but Python's splitlines() and JavaScript break lines at them (a
// helper's script lost sequences so): --json writes them escaped, one object per line for every reader.
TEST_F(Cli, JsonLinesEscapeTheUnicodeLineSeparators) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const std::string prompt = "a" "\xE2\x80\xA8" "b" "\xE2\x80\xA9" "c";
  std::ofstream(path("separators.txt")) << prompt << "\n";
  const ProcessResult r = run_process(shardline() + " run --json --steps 2 --model " + model_file("tiny-32k.bin") +
                                      " --tokenizer " + model_file("tokenizer.bin") + " --prompts-file " +
                                      path("separators.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("\xE2\x80\xA8"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("\xE2\x80\xA9"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"prompt\":\"a\\u2028b\\u2029c\""), std::string::npos) << r.out;
  EXPECT_EQ(parse_single_json(r.out)["prompt"], prompt);  // the same text once parsed
}

TEST_F(Cli, PlainRunPrintsExactlyTheReferenceText) {
  // The issue's acceptance line: mini-gqa, prompt "A", 64 steps prints the golden run_c_text.
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.bin"));
  std::string expected;
  for (const auto& g : load_goldens()) {
    if (g.model == "mini-gqa.bin" && g.prompt == "A") expected = g.run_c_text;
  }
  ASSERT_FALSE(expected.empty());
  const ProcessResult r = run_process(shardline() + " run --model " + model_file("mini-gqa.bin") + " --tokenizer " +
                                      model_file("tokenizer.bin") + " --prompt A --steps 64");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, expected + "\n");
  EXPECT_NE(r.err.find("decode 64 tok"), std::string::npos) << r.err;  // statistics go to stderr
  EXPECT_NE(r.err.find("| TTFT "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" ms/token per sequence |"), std::string::npos) << r.err;
}

TEST_F(Cli, MpirunOneRankMatchesThePlainProcess) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const std::string args = " run --json --threads 1 --model " + model_file("tiny-32k.bin") + " --tokenizer " +
                           model_file("tokenizer.bin") + " --prompt 'Once upon a time' --steps 32";
  const ProcessResult plain = run_process(shardline() + args);
  const ProcessResult mpi = run_process(kMpirun + "1 " + shardline() + args);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(mpi.exit_code, 0) << mpi.err;
  EXPECT_EQ(plain.out, mpi.out);
  EXPECT_EQ(parse_single_json(mpi.out)["ids"].size(), 32u);
}

TEST_F(Cli, DefaultModelSaysItIsRandomAndIsCached) {
  const ProcessResult first = run_process(shardline() + " run --steps 8 --threads 1");
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.err.find("RANDOM WEIGHTS"), std::string::npos) << first.err;
  EXPECT_NE(first.err.find("generating the built-in default model"), std::string::npos) << first.err;
  EXPECT_TRUE(first.out.starts_with("Once upon a time")) << first.out;
  const ProcessResult second = run_process(shardline() + " run --steps 8 --threads 1");
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(second.err.find("generating"), std::string::npos) << "the cached model was not reused";
  EXPECT_EQ(first.out, second.out);
  // A cached tokenizer cut short since is made again (it failed every later run, naming a cache file).
  const fs::path tokenizer = dir_ / "cache" / "default-15m-unshared-seed42.tokenizer.bin";
  ASSERT_TRUE(fs::exists(tokenizer));
  const auto size = fs::file_size(tokenizer);
  fs::resize_file(tokenizer, 10);
  const ProcessResult third = run_process(shardline() + " run --steps 8 --threads 1");
  ASSERT_EQ(third.exit_code, 0) << third.err;
  EXPECT_NE(third.err.find("(or its tokenizer) is not this shape's any more: generating it again"), std::string::npos)
      << third.err;
  EXPECT_EQ(fs::file_size(tokenizer), size);
  EXPECT_EQ(first.out, third.out);
}

TEST_F(Cli, GeneratedModelOfAnyShapeRuns) {
  const std::string model = path("gqa.bin");
  const ProcessResult gen = run_process(shardline() + " gen-model --dim 96 --hidden 260 --layers 5 --heads 6 "
                                        "--kv-heads 3 --vocab 512 --seq 128 --seed 3 --out " + model);
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_TRUE(fs::exists(runtime::default_tokenizer_path_for(model)));
  const ProcessResult run = run_process(shardline() + " run --json --model " + model + " --steps 20 --prompt hello");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(parse_single_json(run.out)["ids"].size(), 20u);
}

TEST_F(Cli, MissingModelFile) {
  expect_clean_failure("run --model " + path("nope.bin") + " --tokenizer " + path("nope.tok"), 4, "nope.bin");
}

TEST_F(Cli, MissingModelIsNamedBeforeItsTokenizerIsLookedFor) {
  // Without --tokenizer the tokenizer is looked for beside the model; a missing model must say so itself.
  expect_clean_failure("run --model " + path("nope.bin"), 4, "nope.bin");
  const ProcessResult r = run_process(shardline() + " run --model " + path("nope.bin"), 60);
  EXPECT_EQ(r.err.find("tokenizer"), std::string::npos) << r.err;
}

// No tokenizer beside a model (and no --tokenizer) is a missing file, exit 4 as a missing --tokenizer is.
TEST_F(Cli, NoTokenizerBesideTheModelIsAMissingFile) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  std::filesystem::create_directories(path("alone"));
  std::filesystem::create_symlink(model_file("tiny-32k.bin"), path("alone/model.bin"));
  expect_clean_failure("run --model " + path("alone/model.bin"), 4, "no tokenizer found");
  expect_clean_failure("run --model " + path("alone/model.bin") + " --tokenizer " + path("alone/tok.bin"), 4, "tok.bin");
}

// A folder where a file is read, or a named pipe given as a model or tokenizer (each is opened twice, and
// open() on a FIFO waits for a writer: these used to hang until killed), fail at once with exit 4. Text
// inputs may be pipes: prompts from /dev/stdin, a hostfile from a process substitution.
TEST_F(Cli, FoldersAndPipesGivenAsInputFiles) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.gguf"));
  const std::string fifo = path("pipe.bin");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string gguf = model_file("tiny-32k.gguf");
  auto commands = [&](const std::string& input) {
    return std::vector<std::string>{"run --model " + input, "run --model " + gguf + " --tokenizer " + input,
                                    "run --model " + gguf + " --prompts-file " + input,
                                    "plan --model " + gguf + " --probe-file " + input,
                                    "launch-check --tp 1 --pp 1 --hostfile " + input,
                                    "launch-check --tp 1 --pp 1 --rankfile " + input};
  };
  for (const std::string& args : commands(dir_.string())) {
    const ProcessResult r = run_process(shardline() + " " + args, 20);
    EXPECT_EQ(r.exit_code, 4) << args << "\nstderr: " << r.err;
    EXPECT_TRUE(r.err.find("a folder, not a file") != std::string::npos ||
                r.err.find("not a regular file") != std::string::npos)
        << args << "\nstderr: " << r.err;
  }
  for (const std::string& args : {commands(fifo)[0], commands(fifo)[1]}) {
    const ProcessResult r = run_process(shardline() + " " + args, 20);
    EXPECT_EQ(r.exit_code, 4) << args << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find("not a regular file"), std::string::npos) << args << "\nstderr: " << r.err;
  }
  const ProcessResult piped = run_process(
      "bash -c " + shell_quote("printf 'A\\nB\\n' | " + shardline() + " run --model " + gguf +
                               " --steps 2 --prompts-file /dev/stdin"));
  EXPECT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_NE(piped.err.find("2 sequences"), std::string::npos) << piped.err;
  // Under mpirun only the first task gets stdin: the empty one the others read says why.
  const ProcessResult piped_mpi = run_process(
      "bash -c " + shell_quote("printf 'A\\n' | " + kMpirun + "2 " + shardline() + " run --model " + gguf +
                               " --steps 2 --prompts-file /dev/stdin"), 60);
  EXPECT_EQ(piped_mpi.exit_code, 2) << piped_mpi.err;
  EXPECT_NE(piped_mpi.err.find("holds no prompt (one per line); every rank reads it, and under mpirun or srun only the "
                               "first task gets the launcher's stdin"),
            std::string::npos)
      << piped_mpi.err;
  const ProcessResult substituted = run_process(
      "bash -c " + shell_quote(shardline() + " launch-check --tp 2 --pp 1 --hostfile <(echo 'localhost slots=2')"));
  EXPECT_EQ(substituted.exit_code, 0) << substituted.err;
}

TEST_F(Cli, GgufFilesReproduceEveryGoldenWithTheirOwnVocabulary) {
  // llama.cpp's GGUF files of the reference models, no --tokenizer: the vocabulary comes from the file.
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("goldens.jsonl"));
  for (const auto& golden : load_goldens()) {
    const std::string gguf = model_file(fs::path(golden.model).replace_extension(".gguf").string());
    SHARDLINE_REQUIRE_MODEL_FILE(gguf);
    const ProcessResult r = run_process(shardline() + " run --json --threads 1 --model " + gguf + " --steps " +
                                        std::to_string(golden.steps) + " --prompt " + shell_quote(golden.prompt));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = parse_single_json(r.out);
    EXPECT_EQ(j["prompt_ids"].get<std::vector<int>>(), golden.prompt_ids) << gguf << " " << golden.prompt;
    EXPECT_EQ(j["ids"].get<std::vector<int>>(), golden.ids) << gguf << " " << golden.prompt;
    if (golden.model == "mini-gqa.bin" && golden.prompt == "A") {  // and the text, decoded by the file's vocabulary
      const ProcessResult text = run_process(shardline() + " run --model " + gguf + " --prompt A --steps 64");
      ASSERT_EQ(text.exit_code, 0) << text.err;
      EXPECT_EQ(text.out, golden.run_c_text + "\n");
    }
  }
}

TEST_F(Cli, AGgufOfAnotherShapeRunsAsItsCheckpointOnEveryLayout) {
  // GQA 6/2, head size 20, hidden 250, 3 layers, vocab 301; the GGUF's tensors shuffled and 64-byte aligned.
  const std::string model = path("odd.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 120 --hidden 250 --layers 3 --heads 6 --kv-heads 2 --vocab 301 "
                                      "--seq 48 --seed 9 --out " + model).exit_code, 0);
  llama_gguf_from_llama2c(model, runtime::default_tokenizer_path_for(model), {.alignment = 64, .shuffle_seed = 5})
      .write(path("odd.gguf"), 64);
  const std::string args = " run --json --threads 1 --steps 24 --prompt 'hello there' ";
  for (const std::string sampling : {"", "--temperature 0.9 --seed 3", "--weights-dtype bf16"}) {
    const ProcessResult bin = run_process(shardline() + args + sampling + " --model " + model);
    ASSERT_EQ(bin.exit_code, 0) << bin.err;
    const auto expected = parse_single_json(bin.out)["ids"];
    for (const auto& [np, layout] : std::vector<std::pair<int, std::string>>{{1, ""}, {2, "--tp 2"}, {3, "--pp 3"}}) {
      const ProcessResult gguf = run_process(kMpirun + std::to_string(np) + " " + shardline() + args + sampling + " " +
                                             layout + " --model " + path("odd.gguf"));
      ASSERT_EQ(gguf.exit_code, 0) << layout << "\n" << gguf.err;
      EXPECT_EQ(parse_single_json(gguf.out)["ids"], expected) << sampling << " " << layout;
    }
  }
}

// A GGUF's context_length sizes the automatic KV pool, which must stay within the machine's memory: 64
// contexts of 2^24 positions are a TiB of address space here, which a `ulimit -v` or the kernel refuses (a
// 70B shape's were 40 PiB), although the run's sequences are short.
TEST_F(Cli, AHugeContextLengthKeepsTheKvPoolWithinMemory) {
  const std::string model = path("long.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 120 --hidden 250 --layers 3 --heads 6 --kv-heads 2 --vocab 301 "
                                      "--seq 48 --seed 9 --out " + model).exit_code, 0);
  llama_gguf_from_llama2c(model, runtime::default_tokenizer_path_for(model), {.context_length = 1u << 24})
      .write(path("long.gguf"));
  const std::string args = " run --json --threads 1 --steps 24 --prompt 'hello there' ";
  const ProcessResult bin = run_process(shardline() + args + " --model " + model);
  ASSERT_EQ(bin.exit_code, 0) << bin.err;
  const ProcessResult gguf = run_process(kMpirun + "2 " + shardline() + args + " --tp 2 --verbose --model " + path("long.gguf"));
  ASSERT_EQ(gguf.exit_code, 0) << gguf.err;
  EXPECT_EQ(parse_single_json(gguf.out)["ids"], parse_single_json(bin.out)["ids"]);
  // "KV pool 16 tokens/block of fp32, 0 used, N free of N blocks (...; 2 committed = 2.0 MiB of X GiB reserved...)"
  const std::uint64_t memory = memory::read_meminfo().total_bytes;
  const std::regex pool(R"(of (\d+) blocks \(.* of ([0-9.]+) (KiB|MiB|GiB|TiB|PiB) reserved)");
  int pools = 0;
  for (auto it = std::sregex_iterator(gguf.err.begin(), gguf.err.end(), pool); it != std::sregex_iterator(); ++it) {
    const double unit = std::map<std::string, double>{{"KiB", 0x1p10}, {"MiB", 0x1p20}, {"GiB", 0x1p30},
                                                      {"TiB", 0x1p40}, {"PiB", 0x1p50}}.at((*it)[3]);
    // Three quarters of at most the host's memory, shared by the two ranks on this host.
    EXPECT_LE(std::stod((*it)[2]) * unit, 1.01 * 0.75 * static_cast<double>(memory) / 2) << it->str();
    ++pools;
  }
  EXPECT_GE(pools, 2) << gguf.err;  // a line (or two) per rank
}

// An explicit --kv-blocks past the rank's share of memory: refused at start-up with the largest that fits
// (it was taken as given: 2^31 - 1 blocks reserved 26 TiB of address space and a 2 GB free list, and a pool
// past memory only failed when the kernel killed the rank). One that fits runs as before.
TEST_F(Cli, AnExplicitKvPoolPastMemoryIsRefusedWithTheLargestThatFits) {
  const std::string model = path("m.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 64 --hidden 160 --layers 2 --heads 4 --vocab 300 --seq 64 "
                                      "--out " + model).exit_code, 0);
  const std::string args = " run --steps 4 --prompt hi --model " + model + " --kv-blocks ";
  const ProcessResult huge = run_process(shardline() + args + "2147483647");
  EXPECT_EQ(huge.exit_code, 4) << huge.err;
  EXPECT_NE(huge.err.find("--kv-blocks 2147483647 asks for"), std::string::npos) << huge.err;
  std::smatch most;
  ASSERT_TRUE(std::regex_search(huge.err, most, std::regex(R"(pass at most (\d+), or 0 for the automatic size)")))
      << huge.err;
  EXPECT_GT(std::stoll(most[1]), 1000) << "a 2-layer model's blocks are small";
  EXPECT_EQ(run_process(shardline() + args + "64").exit_code, 0);
}

// The commands that are not MPI jobs, started under mpirun anyway: plan once per launch, gen-model and topo
// once per host (here one host), the other ranks ending at once. Each rank used to print its own copy, and
// gen-model's ranks raced to write the same file.
TEST_F(Cli, CommandsThatAreNotMpiJobsRunOnceUnderMpirun) {
  const std::string plan = shardline() + " plan --preset 15m --cluster " + std::string(SHARDLINE_SOURCE_DIR) +
                           "/hostfiles/cluster-this-vm.json";
  ProcessResult r = run_process(kMpirun + "3 " + plan);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.out, "objective latency"), 1u) << r.out;
  // One line says so, from the task that runs it (each of the others said it too: 63 lines from 64 tasks).
  EXPECT_EQ(count_of(r.err, "plan runs on the first task of an mpirun or srun launch; the other 2 tasks end without "
                            "running it"), 1u) << r.err;
  EXPECT_EQ(count_of(r.err, "plan runs on the first task"), 1u) << r.err;
  // The task numbers come from the launcher's variables: a script started as task 1 that runs plan itself
  // ends at once, and SHARDLINE_EVERY_TASK=1 runs the command anyway.
  const std::string task_1 = "OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_LOCAL_RANK=1 ";
  r = run_process("env " + task_1 + plan);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
  r = run_process("env SHARDLINE_EVERY_TASK=1 " + task_1 + plan);
  EXPECT_EQ(count_of(r.out, "objective latency"), 1u) << r.err;
  // A launcher variable of nonsense is run's and probe's to report; these commands never read one.
  r = run_process("env SLURM_JOB_ID=1 'SLURM_TASKS_PER_NODE=2(x3' " + shardline() + " topo");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.out, "topology: this host"), 1u) << r.err;
  // A local rank past what an int holds is no placement hint (it overflowed, or aborted on a failed check).
  for (const char* local : {"2147483647", "2147483648", "99999999999999999999"}) {
    r = run_process(std::string("env SLURM_LOCALID=") + local + " " + shardline() + " run --steps 2 --threads 1");
    EXPECT_EQ(r.exit_code, 0) << local << ": " << r.err;
  }
  const std::string model = path("once.bin");
  r = run_process(kMpirun + "3 " + shardline() + " gen-model --dim 64 --hidden 128 --layers 2 --heads 4 --vocab 512 "
                  "--seq 64 --out " + model);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.err, "wrote " + model), 1u) << r.err;
  EXPECT_TRUE(fs::exists(model));
  r = run_process(kMpirun + "2 " + shardline() + " topo");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.out, "topology: this host"), 1u) << r.out;
  // launch-check started by mpirun itself checks the launch's own task count (it said ok for 4 ranks in 3).
  r = run_process(kMpirun + "3 " + shardline() + " launch-check --tp 2 --pp 2");
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_EQ(count_of(r.err, "this launch started 3 tasks but tp=2 x pp=2 uses 4 ranks"), 1u) << r.err;
  r = run_process(kMpirun + "2 " + shardline() + " launch-check --tp 2 --pp 1");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.out, "launch-check: ok: tp=2 x pp=1 = 2 ranks"), 1u) << r.out;
  // A bad flag still fails the launch: the rank that runs the command reports it.
  r = run_process(kMpirun + "2 " + shardline() + " plan --preset nonsense");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(count_of(r.err, "unknown model preset 'nonsense'"), 1u) << r.err;
  // The top-level help and version, as a command's own --help: printed once.
  for (const char* flag : {" --help", " --version"}) {
    r = run_process(kMpirun + "2 " + shardline() + flag);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, run_process(shardline() + flag).out);
  }
}

// MPICH's (or Intel MPI's) mpiexec, Hydra, wires its tasks over PMI, which Open MPI cannot join: each task
// generated the whole text alone, and the launch exited 0. Now one task says so and the launch fails; the
// commands that run once count Hydra's tasks as they count mpirun's. Hydra is mpich's, installed for this.
TEST_F(Cli, TasksOfAHydraLaunchAreRefusedWithOneLine) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  ASSERT_EQ(run_process("sh -c 'command -v mpiexec.hydra'").exit_code, 0)
      << "mpiexec.hydra not found: scripts/install-deps.sh installs it (Debian's mpich)";
  const std::string hydra = "mpiexec.hydra -n ";
  ProcessResult r = run_process(hydra + "2 " + shardline() + " run --model " + model_file("tiny-32k.bin") +
                                " --steps 4", 60);
  EXPECT_NE(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.err, "error: "), 1u) << r.err;
  EXPECT_NE(r.err.find("started as 2 tasks by a PMI launcher"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("'mpirun -np 2 shardline ...'"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("Once upon"), std::string::npos) << r.out;
  r = run_process(hydra + "3 " + shardline() + " plan --preset 15m --cluster " + std::string(SHARDLINE_SOURCE_DIR) +
                  "/hostfiles/cluster-this-vm.json", 60);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count_of(r.out, "objective latency"), 1u) << r.out;
  EXPECT_EQ(count_of(r.err, "plan runs on the first task"), 1u) << r.err;
  EXPECT_NE(r.err.find("the other 2 tasks end without running it"), std::string::npos) << r.err;
  r = run_process(hydra + "2 " + shardline() + " --version", 60);
  EXPECT_EQ(r.out, "shardline 0.1.0\n") << r.err;
}

// A batch's sampled rows draw their tokens on the kernel threads, each sequence with its own sampler: the
// tokens must not depend on how many threads there are or which one drew a row.
TEST_F(Cli, SampledBatchesGiveTheSameTokensOnAnyThreadCount) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  for (const std::string sampling : {"--temperature 0.9 --top-p 0.9", "--temperature 1.2 --top-p 0"}) {
    const std::string run = shardline() + " run --json --model " + model_file("tiny-32k.bin") +
                            " --batch 5 --steps 12 --seed 5 " + sampling;
    const ProcessResult one = run_process(run + " --threads 1");
    ASSERT_EQ(one.exit_code, 0) << one.err;
    EXPECT_EQ(std::count(one.out.begin(), one.out.end(), '\n'), 5) << one.out;
    for (const char* threads : {" --threads 2", " --threads 3"}) {
      const ProcessResult more = run_process(run + threads);
      ASSERT_EQ(more.exit_code, 0) << more.err;
      EXPECT_EQ(more.out, one.out) << sampling << threads;
    }
  }
}

// A GGUF file whose matrices and embedding are F16, BF16 or one of ggml's block formats must give the tokens of
// a llama2.c checkpoint of the values those tensors decode to (the file's weights rounded, or quantised, as it
// holds them), on one rank and with TP. The K-quants need rows of 256 values, so they get a wider model.
// Each file is the model written with one set of options (one type for every matrix, or a preset's mix).
void expect_gguf_gives_its_decoded_checkpoint(const std::string& model, const std::string& dir,
                                              const std::vector<LlamaGgufOptions>& files) {
  const std::string tokenizer = runtime::default_tokenizer_path_for(model);
  const runtime::ModelFile file = runtime::read_model_file(model);
  const partition::ModelShape& s = file.shape;
  const std::uint64_t d = s.dim, h = s.hidden_dim, kv = s.kv_dim(), v = s.vocab_size;
  struct Matrix {
    std::string name;  // in the GGUF file
    std::uint64_t offset, n;
  };
  std::vector<Matrix> matrices = {{"token_embd.weight", file.layout.token_embedding.offset, v * d}};
  if (!s.shared_classifier) matrices.push_back({"output.weight", file.layout.classifier.offset, v * d});
  for (int i = 0; i < s.n_layers; ++i) {
    const runtime::LayerTensors& l = file.layout.layers[i];
    const std::string b = "blk." + std::to_string(i) + ".";
    for (const Matrix& m : std::vector<Matrix>{{"attn_q", l.wq.offset, d * d}, {"attn_k", l.wk.offset, kv * d},
                                               {"attn_v", l.wv.offset, kv * d}, {"attn_output", l.wo.offset, d * d},
                                               {"ffn_gate", l.w1.offset, h * d}, {"ffn_down", l.w2.offset, d * h},
                                               {"ffn_up", l.w3.offset, h * d}}) {
      matrices.push_back({b + m.name + ".weight", m.offset, m.n});
    }
  }
  const std::string gguf_path = dir + "/decoded.gguf", rounded_path = dir + "/decoded.bin";
  for (const LlamaGgufOptions& options : files) {
    const std::uint32_t main_type = options.type_of("blk.0.ffn_gate.weight");  // the type run's note names
    llama_gguf_from_llama2c(model, tokenizer, options).write(gguf_path);
    std::ifstream in(model, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const Matrix& m : matrices) {
      const std::uint32_t type = options.type_of(m.name);
      std::vector<float> x(m.n);
      std::memcpy(x.data(), bytes.data() + m.offset, m.n * 4);
      if (ggml_block_values(type) > 1) {
        x = quantize_blocks(type, x.data(), m.n).values;
      } else if (type != 0) {
        for (float& value : x) {
          value = type == 1 ? kernels::cpu::fp16_to_float(kernels::cpu::float_to_fp16(value))
                            : kernels::cpu::bf16_to_float(kernels::cpu::float_to_bf16(value));
        }
      }
      std::memcpy(bytes.data() + m.offset, x.data(), m.n * 4);
    }
    std::ofstream(rounded_path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    const std::string args = " run --json --steps 20 --prompt hello --tokenizer " + tokenizer;
    const ProcessResult rounded = run_process(shardline() + args + " --threads 1 --model " + rounded_path);
    ASSERT_EQ(rounded.exit_code, 0) << rounded.err;
    // One rank decodes the file on two threads (in chunks, shard_weights.cpp), two ranks on one each.
    for (const std::string np : {"1", "2"}) {
      const ProcessResult gguf = run_process(kMpirun + np + " " + shardline() + args + " --threads " +
                                             (np == "1" ? "2" : "1") + " --tp " + np + " --model " + gguf_path);
      ASSERT_EQ(gguf.exit_code, 0) << gguf.err;
      EXPECT_EQ(parse_single_json(gguf.out)["ids"], parse_single_json(rounded.out)["ids"])
          << main_type << " np " << np;
      // A quantised file held in fp32 (the default) takes several times its bytes: one line says so.
      EXPECT_EQ(count_of(gguf.err, "holds " + runtime::gguf_type_name(main_type) + " weights"),
                ggml_block_values(main_type) > 1 ? 1u : 0u) << gguf.err;
    }
  }
}

// One type for every matrix and the embedding.
std::vector<LlamaGgufOptions> one_type_each(const std::vector<std::uint32_t>& types) {
  std::vector<LlamaGgufOptions> files;
  for (const std::uint32_t type : types) files.push_back({.matrix_type = type});
  return files;
}

TEST_F(Cli, F16Bf16AndBlockFormatGgufGiveTheTokensOfTheirDecodedCheckpoint) {
  const std::string model = path("h.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 64 --hidden 160 --layers 2 --heads 4 --kv-heads 2 --vocab 300 "
                                      "--seq 40 --seed 4 --out " + model).exit_code, 0);
  // Q4_0 .. Q5_1 and IQ4_NL are what llama-quantize writes for rows of 32 (and K-quant files for rows that are
  // no multiple of 256).
  expect_gguf_gives_its_decoded_checkpoint(
      model, dir_.string(), one_type_each({1u, 30u, kGgmlQ8_0, kGgmlQ4_0, kGgmlQ4_1, kGgmlQ5_0, kGgmlQ5_1, kGgmlIQ4_NL}));
}

TEST_F(Cli, KQuantGgufGivesTheTokensOfItsDecodedCheckpoint) {
  const std::string model = path("k.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 256 --hidden 512 --layers 2 --heads 4 --kv-heads 2 --vocab 300 "
                                      "--seq 40 --seed 6 --unshared-classifier --out " + model).exit_code, 0);
  std::vector<LlamaGgufOptions> files =
      one_type_each({kGgmlQ2_K, kGgmlQ3_K, kGgmlQ4_K, kGgmlQ5_K, kGgmlQ6_K, kGgmlIQ4_XS});
  // Q4_K_M's mix: Q6_K for attn_v, ffn_down and the classifier, Q4_K elsewhere; and one with every type
  // there is in one file, each tensor decoded by its own type.
  files.push_back({.matrix_type = kGgmlQ4_K,
                   .tensor_types = {{"attn_v.weight", kGgmlQ6_K}, {"ffn_down.weight", kGgmlQ6_K},
                                    {"output.weight", kGgmlQ6_K}}});
  files.push_back({.matrix_type = kGgmlQ5_K,
                   .tensor_types = {{"token_embd.weight", kGgmlQ8_0}, {"output.weight", 1u}, {"attn_q.weight", kGgmlQ4_0},
                                    {"attn_k.weight", kGgmlIQ4_NL}, {"attn_v.weight", kGgmlQ3_K},
                                    {"attn_output.weight", kGgmlQ2_K}, {"ffn_up.weight", 30u},
                                    {"ffn_down.weight", kGgmlIQ4_XS}}});
  expect_gguf_gives_its_decoded_checkpoint(model, dir_.string(), files);
}

TEST_F(Cli, AGgufFilesEpsilonAndRopeBaseReachTheArithmetic) {
  // The same weights with another RMSNorm epsilon or RoPE base must give other tokens (the defaults are
  // llama2.c's 1e-5 and 10000, which every other test uses).
  const std::string model = path("e.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 64 --hidden 160 --layers 2 --heads 4 --vocab 300 --seq 64 "
                                      "--seed 6 --out " + model).exit_code, 0);
  const std::string tokenizer = runtime::default_tokenizer_path_for(model);
  auto ids_of = [&](const LlamaGgufOptions& options) {
    llama_gguf_from_llama2c(model, tokenizer, options).write(path("e.gguf"));
    const ProcessResult r = run_process(shardline() + " run --json --threads 1 --steps 40 --prompt hi --model " +
                                        path("e.gguf"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return parse_single_json(r.out)["ids"];
  };
  const auto defaults = ids_of({});
  const ProcessResult bin = run_process(shardline() + " run --json --threads 1 --steps 40 --prompt hi --model " + model);
  EXPECT_EQ(defaults, parse_single_json(bin.out)["ids"]);
  EXPECT_NE(ids_of({.rope_freq_base = 500000}), defaults);
  EXPECT_NE(ids_of({.rms_eps = 0.5f}), defaults);
  // Llama 3.1's RoPE divisors (rope_freqs.weight, 8 pairs of a 16-wide head): ones change nothing, others
  // reach every rank's rotation alike.
  EXPECT_EQ(ids_of({.rope_freqs = std::vector<float>(8, 1.0f)}), defaults);
  const std::vector<float> divisors = {8, 8, 4, 4, 2, 2, 1, 1};
  const auto scaled = ids_of({.rope_freqs = divisors});
  EXPECT_NE(scaled, defaults);
  const ProcessResult tp2 = run_process(kMpirun + "2 " + shardline() + " run --json --threads 1 --steps 40 --prompt hi --tp 2 "
                                        "--model " + path("e.gguf"));
  ASSERT_EQ(tp2.exit_code, 0) << tp2.err;
  EXPECT_EQ(parse_single_json(tp2.out)["ids"], scaled);
}

TEST_F(Cli, ALlama3StyleGgufRunsWithItsByteLevelVocabulary) {
  // A GGUF file with Llama 3's vocabulary kind (byte-level BPE, its own BOS and end ids, RoPE base 500000): the
  // prompt becomes the ids ByteLevelBpe gives, the text is the decoded ids, every layout gives the same tokens,
  // and generation stops at an end id without writing it.
  const std::string model = path("l3.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 64 --hidden 160 --layers 2 --heads 4 --kv-heads 2 --vocab 400 "
                                      "--seq 64 --seed 8 --out " + model).exit_code, 0);
  const runtime::ByteLevelVocabulary vocabulary = make_byte_level_vocabulary(400);
  auto write = [&](const runtime::ByteLevelVocabulary& v) {
    llama_gguf_from_llama2c(model, "", {.rope_freq_base = 500000, .byte_level = v}).write(path("l3.gguf"));
  };
  write(vocabulary);
  const std::string prompt = "<|begin_of_text|>Once upon a time, Lily's friend";
  const std::string args = " run --json --threads 1 --steps 24 --model " + path("l3.gguf") + " --prompt \"" + prompt + "\"";
  const ProcessResult one = run_process(shardline() + args);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const nlohmann::json out = parse_single_json(one.out);
  const runtime::ByteLevelBpe bpe(make_byte_level_vocabulary(400), "test");
  // The prompt's own "<|begin_of_text|>" is its one BOS; a prompt without it is given one.
  EXPECT_EQ(out["prompt_ids"].get<std::vector<int>>(), bpe.encode(prompt));
  EXPECT_EQ(bpe.encode(prompt).front(), vocabulary.bos_id);
  const ProcessResult plain = run_process(shardline() + " run --json --threads 1 --steps 1 --model " + path("l3.gguf") +
                                          " --prompt \"Once upon\"");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  std::vector<int> want_plain = {vocabulary.bos_id};
  for (const int id : bpe.encode("Once upon")) want_plain.push_back(id);
  EXPECT_EQ(parse_single_json(plain.out)["prompt_ids"].get<std::vector<int>>(), want_plain);
  const std::vector<int> ids = out["ids"].get<std::vector<int>>();
  ASSERT_GE(ids.size(), 4u);
  std::string generated;
  for (const int id : ids) generated += bpe.decode(id);
  EXPECT_EQ(out["generated_text"].get<std::string>(), generated);
  EXPECT_EQ(out["text"].get<std::string>(), "Once upon a time, Lily's friend" + generated);  // specials print nothing
  for (const char* layout : {"--tp 2", "--pp 2"}) {
    const ProcessResult two = run_process(kMpirun + "2 " + shardline() + args + " " + layout);
    ASSERT_EQ(two.exit_code, 0) << layout << ": " << two.err;
    EXPECT_EQ(parse_single_json(two.out)["ids"], out["ids"]) << layout;
  }
  // launch-check reads the file's vocabulary as run will: a BOS id past it is refused before the launch.
  EXPECT_EQ(run_process(shardline() + " launch-check --tp 2 --pp 1 --np 2 --model " + path("l3.gguf")).exit_code, 0);
  runtime::ByteLevelVocabulary broken = vocabulary;
  broken.bos_id = 400;
  write(broken);
  expect_clean_failure("launch-check --tp 2 --pp 1 --np 2 --model " + path("l3.gguf"), 3,
                       "tokenizer.ggml.bos_token_id is 400 but the vocabulary has 400 tokens");
  expect_clean_failure("run --model " + path("l3.gguf"), 3, "tokenizer.ggml.bos_token_id is 400 but the vocabulary has 400 tokens");
  // The same file with its EOS set to the fourth token it generated: the first three, then the end.
  runtime::ByteLevelVocabulary ending = vocabulary;
  ending.end_ids = {ids[3]};
  write(ending);
  const std::vector<int> first = {ids.begin(), std::find(ids.begin(), ids.end(), ids[3])};
  const ProcessResult stopped = run_process(shardline() + args);
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_EQ(parse_single_json(stopped.out)["ids"].get<std::vector<int>>(), first);
  // Said as the file's end token, not as llama2.c's BOS.
  EXPECT_NE(stopped.err.find(fmt::format("the model ended the text (sampled an end-of-text token: '{}') after {} of "
                                         "--steps 24 tokens",
                                         vocabulary.tokens[ids[3]], first.size())),
            std::string::npos)
      << stopped.err;
  // A prompt that is not UTF-8 among several is named by its place, as a prompt too long for the context is.
  {
    std::ofstream prompts(path("mixed.txt"), std::ios::binary);
    prompts << "Once upon\n" << "caf\xe9 in Latin-1\n";
  }
  expect_clean_failure("run --model " + path("l3.gguf") + " --prompts-file " + path("mixed.txt"), 2,
                       "sequence 2 of 2 (prompt \"caf\\xe9 in Latin-1\"): the prompt is not UTF-8 text (byte 3 is 0xE9)");
}

TEST_F(Cli, ASentencePieceGgufParsesSpecialTokensInThePromptAndEndsAtItsEos) {
  // A GGUF file with a SentencePiece vocabulary is used as llama.cpp uses it: "</s>" and "<s>" written in the
  // prompt are EOS and BOS, every layout gives the same tokens, and generation ends at the file's EOS or EOT
  // (not at llama2.c's BOS), without writing it.
  const std::string model = path("spm.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 64 --hidden 160 --layers 2 --heads 4 --kv-heads 2 --vocab 400 "
                                      "--seq 64 --seed 9 --out " + model).exit_code, 0);
  const std::string tokenizer = runtime::default_tokenizer_path_for(model);
  llama_gguf_from_llama2c(model, tokenizer).write(path("spm.gguf"));
  const std::string prompt = "the rain</s>and <s>so";
  const std::string args = " run --json --threads 1 --steps 24 --model " + path("spm.gguf") + " --prompt \"" + prompt + "\"";
  const ProcessResult one = run_process(shardline() + args);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const nlohmann::json out = parse_single_json(one.out);
  const runtime::Tokenizer vocabulary(path("spm.gguf"), 400), llama2c(tokenizer, 400);
  const std::vector<int> prompt_ids = out["prompt_ids"].get<std::vector<int>>();
  EXPECT_EQ(prompt_ids, vocabulary.encode(prompt, true, false));
  EXPECT_EQ(std::count(prompt_ids.begin(), prompt_ids.end(), runtime::kEosId), 1);
  EXPECT_EQ(std::count(prompt_ids.begin(), prompt_ids.end(), runtime::kBosId), 2);
  EXPECT_NE(prompt_ids, llama2c.encode(prompt, true, false));
  EXPECT_EQ(out["text"].get<std::string>().find("</s>"), std::string::npos);  // control tokens print nothing
  const std::vector<int> ids = out["ids"].get<std::vector<int>>();
  ASSERT_GE(ids.size(), 4u);
  for (const char* layout : {"--tp 2", "--pp 2"}) {
    const ProcessResult two = run_process(kMpirun + "2 " + shardline() + args + " " + layout);
    ASSERT_EQ(two.exit_code, 0) << layout << ": " << two.err;
    EXPECT_EQ(parse_single_json(two.out)["ids"], out["ids"]) << layout;
  }
  // The same file with an EOT id at the fourth token it generated: the tokens before it, then the end.
  llama_gguf_from_llama2c(model, tokenizer, {.eot_token_id = ids[3]}).write(path("spm.gguf"));
  const std::vector<int> first = {ids.begin(), std::find(ids.begin(), ids.end(), ids[3])};
  const ProcessResult stopped = run_process(shardline() + args);
  ASSERT_EQ(stopped.exit_code, 0) << stopped.err;
  EXPECT_EQ(parse_single_json(stopped.out)["ids"].get<std::vector<int>>(), first);
  EXPECT_NE(stopped.err.find(fmt::format("the model ended the text (sampled an end-of-text token: '</s>' or '{}') after "
                                         "{} of --steps 24 tokens",
                                         llama2c.piece(ids[3]), first.size())),
            std::string::npos)
      << stopped.err;
}

TEST_F(Cli, GgufModelsPlanAndLaunchCheckLikeCheckpoints) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.gguf"));
  const ProcessResult plan = run_process(shardline() + " plan --model " + model_file("mini-gqa.gguf") + " --json --np 2");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_EQ(nlohmann::json::parse(plan.out)["model"]["shape"],
            "dim 128, hidden 384, 4 layers, 8 heads / 2 kv, vocab 32000, seq 128, unshared classifier");
  const ProcessResult check = run_process(shardline() + " launch-check --tp 2 --pp 2 --np 4 --model " +
                                          model_file("mini-gqa.gguf"));
  EXPECT_EQ(check.exit_code, 0) << check.err;
  expect_clean_failure("launch-check --tp 4 --pp 1 --np 4 --model " + model_file("mini-gqa.gguf"), 2, "n_kv_heads=2");
}

TEST_F(Cli, PlanNoneSaysItsFallbackLayoutWasNotAsked) {
  // 3 ranks, 2 heads, 2 layers: --plan none falls back to tp = 3, then pp = 3, neither of which fits. The error
  // named "tp=1 pp=3" as if the user had asked for it.
  const std::string model = path("two-layers.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 2 --heads 2 --vocab 300 --seq 32 --out " +
                        model).exit_code, 0);
  const ProcessResult r = run_process(kMpirun + "3 " + shardline() + " run --model " + model + " --plan none --steps 2", 60);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("pp=3 exceeds n_layers=2 (every stage needs at least one layer); that is --plan none's fallback "
                       "(tp = all 3 ranks, else pp = all of them): give --tp and --pp that fit the model"),
            std::string::npos) << r.err;
}

TEST_F(Cli, TemperatureAndTopPMustBeNumbers) {
  const std::string model = path("m.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 1 --heads 2 --vocab 300 --seq 32 --out " +
                        model).exit_code, 0);
  expect_clean_failure("run --model " + model + " --steps 3 -t nan", 2, "--temperature must be a finite number >= 0");
  expect_clean_failure("run --model " + model + " --steps 3 -t inf --json", 2, "--temperature");
  expect_clean_failure("run --model " + model + " --steps 3 -t -1", 2, "got -1");
  expect_clean_failure("run --model " + model + " --steps 3 -t 1 -p nan --json", 2, "--top-p must be a number");
}

TEST_F(Cli, DefaultStepsFitAShortContext) {
  // The default of 128 steps is cut to what the prompt leaves of a 16-position context, not refused.
  const std::string model = path("short.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 1 --heads 2 --vocab 300 --seq 16 --out " +
                        model).exit_code, 0);
  const ProcessResult run = run_process(shardline() + " run --json --model " + model + " --prompt hello");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto j = parse_single_json(run.out);
  EXPECT_EQ(j["prompt_ids"].size() + j["ids"].size(), 17u);  // the last token is never fed back: 16 + 1
}

TEST_F(Cli, APromptsFileErrorNamesTheSequence) {
  const std::string model = path("short.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 1 --heads 2 --vocab 300 --seq 16 --out " +
                        model).exit_code, 0);
  std::ofstream(path("prompts.txt")) << "hi\n" << std::string(100, 'x') << " y z\nok\n";
  expect_clean_failure("run --model " + model + " --steps 2 --prompts-file " + path("prompts.txt"), 2,
                       "sequence 2 of 3 (prompt \"xxxx");
}

TEST_F(Cli, APromptsFileSkipsLinesOfBlanksOnly) {
  // Lines of spaces or tabs once ran as prompts of their own, against --help's "blank lines are skipped".
  const std::string model = path("blank.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 1 --heads 2 --vocab 300 --seq 16 --out " +
                        model).exit_code, 0);
  std::ofstream(path("blanks.txt")) << "  \n\t\n \t \nhi\n\n";
  const ProcessResult r = run_process(shardline() + " run --model " + model + " --steps 2 --json --prompts-file " +
                                      path("blanks.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_NE(r.out.find("\"prompt\":\"hi\""), std::string::npos) << r.out;
  std::ofstream(path("only-blanks.txt")) << "  \n\t\n";
  expect_clean_failure("run --model " + model + " --prompts-file " + path("only-blanks.txt"), 2, "holds no prompt");
  // A UTF-8 byte-order mark is no part of the first prompt.
  std::ofstream(path("bom.txt")) << "\xEF\xBB\xBFhi\nhi\n";
  const ProcessResult bom = run_process(shardline() + " run --model " + model + " --steps 2 --json --prompts-file " +
                                        path("bom.txt"));
  ASSERT_EQ(bom.exit_code, 0) << bom.err;
  const std::size_t newline = bom.out.find('\n');
  ASSERT_NE(newline, std::string::npos) << bom.out;
  EXPECT_EQ(bom.out.substr(0, newline), bom.out.substr(newline + 1, bom.out.size() - newline - 2)) << bom.out;
  // A pool too small names the sequence that does not fit.
  expect_clean_failure("run --model " + model + " --steps 4 --kv-block-tokens 1 --kv-blocks 4 --prompts-file " +
                       path("bom.txt"), 4, "but sequence 1 of 2 (7 positions) needs 7");
}

TEST_F(Cli, TruncatedCheckpoint) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const std::string model = copy_prefix(model_file("tiny-32k.bin"), fs::file_size(model_file("tiny-32k.bin")) - 1000, "t.bin");
  expect_clean_failure("run --model " + model + " --tokenizer " + model_file("tokenizer.bin"), 3, "truncated");
}

TEST_F(Cli, NonsenseHeader) {
  const std::int32_t header[7] = {64, 172, 3, 7, 7, 32000, 256};  // 7 heads do not divide dim 64
  std::ofstream(path("h.bin"), std::ios::binary).write(reinterpret_cast<const char*>(header), sizeof(header));
  expect_clean_failure("run --model " + path("h.bin") + " --tokenizer " + path("h.bin"), 3, "n_heads=7 does not divide dim=64");
  const std::int32_t zeros[7] = {0, 0, 0, 0, 0, 0, 0};
  std::ofstream(path("z.bin"), std::ios::binary).write(reinterpret_cast<const char*>(zeros), sizeof(zeros));
  expect_clean_failure("run --model " + path("z.bin") + " --tokenizer " + path("z.bin"), 3, "positive");
}

TEST_F(Cli, TokenizerOfAnotherVocabulary) {
  const std::string model = path("v300.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 1 --heads 2 --vocab 300 --seq 32 --out " +
                        model).exit_code, 0);
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tokenizer.bin"));
  expect_clean_failure("run --model " + model + " --tokenizer " + model_file("tokenizer.bin"), 3,
                       "tokenizer has 32000 tokens but the model expects 300");
}

TEST_F(Cli, PromptLongerThanTheContext) {
  const std::string model = path("short.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 1 --heads 2 --vocab 300 --seq 16 --out " +
                        model).exit_code, 0);
  expect_clean_failure("run --model " + model + " --prompt " + shell_quote(std::string(200, 'x') + " y z w") +
                       " --steps 1", 2, "seq_len) is 16");
}

// An unwritable --dump-logits file is refused before generation, not after every step has run.
TEST_F(Cli, UnwritableLogitsFileIsRefusedBeforeGenerating) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const std::string args = "run --model " + model_file("tiny-32k.bin") + " --tokenizer " + model_file("tokenizer.bin") +
                           " --prompt A --steps 8 --dump-logits " + path("no/such/folder/logits.bin");
  expect_clean_failure(args, 4, "cannot write --dump-logits file");
  EXPECT_EQ(run_process(shardline() + " " + args).out, "");  // no token was generated first
  // Nor the run's own model, which the logits would have replaced.
  const std::string model = path("own.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 1 --heads 2 --vocab 300 --seq 16 --out " +
                        model).exit_code, 0);
  const auto size = fs::file_size(model);
  expect_clean_failure("run --model " + model + " --prompt hi --steps 2 --dump-logits " + model, 2,
                       "is the run's own model file");
  EXPECT_EQ(fs::file_size(model), size);
}

// A write that fails (here /dev/full, as a full disk) is a failed run, exit 4, for the text on stdout, the
// --dump-logits file and probe's profile alike; each used to exit 0 with the output cut short.
TEST_F(Cli, WritesThatFailAreFailedRuns) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.gguf"));
  const std::string run = shardline() + " run --model " + model_file("tiny-32k.gguf") + " --steps 4";
  ProcessResult r = run_process("bash -c " + shell_quote("exec " + run + " > /dev/full"));
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_EQ(count_of(r.err, "writing the output failed"), 1u) << r.err;
  // At the first piece that cannot be written, not after the whole generation (its statistics line).
  const std::string long_run = shardline() + " run --model " + model_file("tiny-32k.gguf") + " --steps 100";
  r = run_process("bash -c " + shell_quote("exec " + long_run + " > /dev/full"));
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_EQ(count_of(r.err, "writing the output failed: No space left on device"), 1u) << r.err;
  EXPECT_EQ(r.err.find("decode "), std::string::npos) << r.err;
  r = run_process(run + " --dump-logits /dev/full");
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("--dump-logits file '/dev/full' failed"), std::string::npos) << r.err;
  r = run_process(shardline() + " probe --quick --out /dev/full", 120);
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("writing --out file '/dev/full' failed (disk full?)"), std::string::npos) << r.err;
}

// The top-level --help and --version, printed before any command runs, check their output too.
TEST_F(Cli, HelpAndVersionToAFullDiskAreFailedRuns) {
  for (const char* flag : {"--help", "--version"}) {
    const ProcessResult r = run_process("bash -c " + shell_quote(std::string("exec ") + shardline() + " " + flag + " > /dev/full"));
    EXPECT_EQ(r.exit_code, 4) << flag << ": " << r.err;
    EXPECT_NE(r.err.find("writing the output failed"), std::string::npos) << flag << ": " << r.err;
  }
}

// Sequences that wait for KV blocks start after others finish: the statistics then give the whole run's
// rate, not a "decode" rate over the few ms after the last first token (once 150 million tok/s). The
// pool's warning follows --log-level like every other line.
TEST_F(Cli, QueuedSequencesGetTheWholeRunsRateAndTheWarningFollowsTheLogLevel) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.gguf"));
  const std::string run = shardline() + " run --model " + model_file("tiny-32k.gguf") + " --batch 8 --steps 16 --kv-blocks 2";
  ProcessResult r = run_process(run);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warn: the KV pool (2 free blocks"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("sequences waited for KV blocks"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("| decode "), std::string::npos) << r.err;
  r = run_process(run + " --log-level off");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  // Without waiting, a sequence may still end before another's first token (one step, prompts of other
  // lengths): the usual prefill/decode split, no claim of waiting.
  std::ofstream(path("prompts.txt")) << "A\nOnce upon a time there was a little girl who\n";
  r = run_process(shardline() + " run --model " + model_file("tiny-32k.gguf") + " --steps 1 --prompts-file " +
                  path("prompts.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("| decode "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("waited"), std::string::npos) << r.err;
}

TEST_F(Cli, StepsBelowOneAreRefusedBeforeTheBuiltInModelIsWritten) {
  // Without --model, --steps 0 first wrote the 98 MB built-in model (and said so), then refused the flag.
  expect_clean_failure("run --steps 0", 2, "--steps must be >= 1, got 0");
  EXPECT_FALSE(fs::exists(dir_ / "cache")) << "the built-in model was written";
}

TEST_F(Cli, StepsBeyondTheContext) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  expect_clean_failure("run --model " + model_file("tiny-32k.bin") + " --tokenizer " + model_file("tokenizer.bin") +
                       " --prompt A --steps 300", 2, "--steps 300");
}

TEST_F(Cli, UnknownFlagsAndCommands) {
  expect_clean_failure("run --frobnicate 3", 2, "unknown flag '--frobnicate' (see");  // nothing near to suggest
  expect_clean_failure("gen-model --out x.bin --sizzle", 2, "unknown flag '--sizzle'");
  expect_clean_failure("fly", 2, "unknown command 'fly'");
  expect_clean_failure("help fly", 2, "unknown command 'fly'");
  // `help run` is `run --help` (it printed the command list); --version takes nothing after it.
  const ProcessResult help = run_process(shardline() + " help run");
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_TRUE(help.out.starts_with("Usage: shardline run")) << help.out;
  const ProcessResult help_help = run_process(shardline() + " help help");  // the command list, as `help`
  EXPECT_EQ(help_help.exit_code, 0) << help_help.err;
  EXPECT_NE(help_help.out.find("\nUsage: shardline <command>"), std::string::npos) << help_help.out;
  expect_clean_failure("help help help", 2, "unexpected argument 'help' after help");
  expect_clean_failure("--version extra", 2, "unexpected argument 'extra' after --version");
  expect_clean_failure("help --version", 2, "unexpected argument '--version' after help");
  expect_clean_failure("run --steps many", 2, "steps");
  std::ofstream(path("two.txt")) << "a\nb\n";
  expect_clean_failure("run --prompt hi --prompts-file " + path("two.txt"), 2, "--prompt and --prompts-file both give");
  // No flag is guessed from a prefix: --top was taken as --top-p (plan has a real --top).
  expect_clean_failure("run --top 5", 2, "unknown flag '--top'");
  expect_clean_failure("plan --preset 15m --mod x.bin", 2, "unknown flag '--mod'");
  // A near miss names the flag meant (a prefix, or two edits at most), still without taking it.
  expect_clean_failure("bench --preset 15m", 2, "unknown flag '--preset' (did you mean '--presets'?)");
  expect_clean_failure("run --stpes 3", 2, "unknown flag '--stpes' (did you mean '--steps'?)");
  expect_clean_failure("run --batch 100000000000", 2, "it does not fit a whole-number flag (-2147483648 to 2147483647)");
  // Other values the options library calls only "invalid" say what the flag takes.
  expect_clean_failure("run --steps 2.5", 2, "for option '--steps' is invalid; it takes a whole number");
  expect_clean_failure("run --temperature 1e40", 2, "it is beyond a float's range (magnitudes up to 3.4e+38)");
  expect_clean_failure("run --top-p x", 2, "for option '--top-p' is invalid; it takes a number");
  expect_clean_failure("run --comm-timeout x", 2, "for option '--comm-timeout' is invalid; it takes a number");
  // launch-check ignores run's flags but not a typo: --modle skipped the model check and said "ok".
  expect_clean_failure("launch-check --tp 4 --pp 1 --modle x.bin", 2,
                       "unknown flag '--modle' (did you mean '--model'?): neither launch-check nor run has it");
  expect_clean_failure("launch-check --tp 1 --pp 1 -q", 2, "unknown flag '-q'");
  // Each a rank count, their product not: it said "ok ... 1073741824 ranks".
  expect_clean_failure("launch-check --tp 32768 --pp 32768", 2, "--tp 32768 x --pp 32768 is 1073741824 ranks; a job has at most 32768");
  expect_clean_failure("launch-check --tp 2 --pp 1 --np 99999", 2, "--np 99999 is not a rank count from 1 to 32768");
  // A layer split's stage count needs no model (it said ok, and run then refused the split).
  expect_clean_failure("launch-check --tp 1 --pp 2 --layers-per-stage 1,1,1", 2,
                       "--layers-per-stage 1,1,1 names 3 stages but pp=2");
  expect_clean_failure("launch-check --tp 1 --pp 2 --layers-per-stage 3,0", 2,
                       "--layers-per-stage 3,0 gives stage 1 0 layers; every stage needs at least one");
  expect_clean_failure("run --stpes=3", 2, "unknown flag '--stpes' (did you mean '--steps'?)");
  expect_clean_failure("run --x=5", 2, "unknown flag '--x' (see");  // too short to guess from
  // run's flags parse as run parses them: a value that starts with a dash is still the flag's value.
  const ProcessResult with_run_flags = run_process(shardline() + " launch-check --tp 1 --pp 1 --prompt '- a list' "
                                                   "--steps=5 -s 7 -z -odd.bin --top-p -1 --temperature 0.5 --json");
  EXPECT_EQ(with_run_flags.exit_code, 0) << with_run_flags.err;
  expect_clean_failure("launch-check --tp 1 --pp 1 --steps many", 2, "the argument ('many') for option '--steps'");
  // The int range is named for an int flag given a whole number, not for a float or a word.
  expect_clean_failure("run --temperature 1234567890123456789012345678901234567890x", 2, "--temperature' is invalid; it takes a number (see");
  expect_clean_failure("run --batch 12-34567890", 2, "--batch' is invalid; it takes a whole number (see");
  expect_clean_failure("plan --preset 15m --tp 1,99999999999", 2,
                       "--tp '1,99999999999': 99999999999 does not fit a whole number");
  // Values the options library would have taken: a negative seed wrapped to 2^64 - 1, an empty topology
  // description showed this host, an empty list entry was skipped.
  expect_clean_failure("run --seed -1", 2, "--seed '-1' is not a whole number");
  expect_clean_failure("gen-model --preset 15m --seed -3 --out " + path("s.bin"), 2, "--seed '-3'");
  expect_clean_failure("gen-model --preset 15m --seed + --out " + path("s.bin"), 2, "--seed '+' is not a whole number");
  expect_clean_failure("gen-model --preset 15m --seed ++3 --out " + path("s.bin"), 2, "--seed '++3'");
  // A leading '+' is taken as the int flags take it (--dim +288): the same file as without it.
  ASSERT_EQ(run_process(shardline() + " gen-model --preset 15m --layers 1 --seed +7 --out " + path("plus.bin")).exit_code, 0);
  ASSERT_EQ(run_process(shardline() + " gen-model --preset 15m --layers +1 --seed 7 --out " + path("seven.bin")).exit_code, 0);
  EXPECT_EQ(read_text_file(path("plus.bin")), read_text_file(path("seven.bin")));  // (binary-safe)
  expect_clean_failure("topo --synthetic ''", 2, "--synthetic needs a description");
  expect_clean_failure("topo --xml ''", 2, "--xml needs a file name");  // (it showed this host)
  // A folder that is a file was said not to exist.
  std::ofstream(path("plain-file")) << "x";
  expect_clean_failure("gen-model --preset 15m --out " + path("plain-file") + "/m.bin", 4,
                       "its folder '" + path("plain-file") + "' is not a folder");
  expect_clean_failure("bench --dtypes fp32,,int8", 2, "--dtypes 'fp32,,int8' has an empty entry");
  // tp x pp past an int wrapped: launch-check crashed or said "ok ... = 0 ranks", run said "launch -1 ranks".
  expect_clean_failure("launch-check --tp 65536 --pp 65536", 2, "--tp 65536 is not a rank count from 1 to 32768");
  expect_clean_failure("run --tp 2 --pp 65537", 2, "--pp 65537 is not a rank count from 1 to 32768");
  // A thread count libgomp cannot create (65536 crashed inside GOMP_parallel with no message).
  expect_clean_failure("run --threads 65536", 2, "--threads 65536 is not a thread count from 1 to 1024");
  expect_clean_failure("run --threads 0", 2, "--threads 0 is not a thread count from 1 to 1024");
  expect_clean_failure("bench --threads 100000", 2, "--threads 100000 is not a thread count from 1 to 1024");
  // More sequences than host memory holds: refused before one is built (this grew to all of the machine's
  // memory over a minute before failing).
  expect_clean_failure("run --batch 2147483647 --steps 3", 4, "2147483647 sequences (--batch 2147483647 x 1 prompt) need about");
  // Steps no context holds are that error (exit 2), not a memory shortage (exit 4) met first.
  const std::string small = path("steps.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 1 --heads 2 --vocab 300 --seq 16 --out " +
                        small).exit_code, 0);
  expect_clean_failure("run --prompt A --steps 2147483647 --model " + small, 2,
                       "--steps 2147483647 after a 3-token prompt needs 2147483649 positions but seq_len is 16");
  // An empty file name (an unset shell variable) is a slip, not "not given": --model '' ran the built-in model.
  for (const char* flag : {"--model", "--tokenizer", "--prompts-file", "--dump-logits"}) {
    expect_clean_failure(fmt::format("run {} ''", flag), 2, fmt::format("{} needs a file name", flag));
  }
  expect_clean_failure("plan --preset 15m --tp 1,40000", 2, "--tp 40000 is not a rank count");
  // A model named without --model used to be dropped, and the built-in model ran instead.
  expect_clean_failure("run " + path("model.bin") + " --steps 4", 2, "unexpected argument '" + path("model.bin") + "'");
  expect_clean_failure("gen-model --dim 32 --hidden 64 --layers 1 --heads 2 --vocab 300 --seq 8 --out " + path("g.gguf"),
                       2, "gen-model writes llama2.c checkpoints");
  expect_clean_failure("gen-model --dim 30 --hidden 64 --layers 1 --heads 4 --vocab 300 --seq 8 --out " + path("x.bin"),
                       2, "n_heads=4 does not divide dim=30");
  expect_clean_failure("gen-model --dim 32 --hidden 64 --layers 1 --heads 4 --vocab 100 --seq 8 --out " + path("x.bin"),
                       2, "--vocab 100 is too small");
}

// gen-model writes under a temporary name and renames at the end. A shape no disk could hold is refused
// before a byte is written (a mistyped --dim once filled the disk), and a write that fails part way (here
// the shell's file-size limit, with SIGXFSZ ignored so write() returns EFBIG) leaves no part file behind.
TEST_F(Cli, GenModelRefusesWhatTheDiskCannotHoldAndLeavesNoPartFile) {
  namespace fs = std::filesystem;
  const fs::path dir = path("gen-out");
  fs::create_directories(dir);
  // Under a file-size limit as well, so that a broken check fails the test instead of filling the disk.
  const ProcessResult huge = run_process("bash -c \"trap '' XFSZ; ulimit -f 1024; exec " + shardline() +
                                         " gen-model --dim 100000 --hidden 100000 --layers 100 --heads 4 --vocab 300 "
                                         "--seq 32 --out " + (dir / "huge.bin").string() + "\"");
  EXPECT_EQ(huge.exit_code, 4) << huge.err;
  EXPECT_NE(huge.err.find("GiB free"), std::string::npos) << huge.err;
  const ProcessResult cut = run_process("bash -c \"trap '' XFSZ; ulimit -f 64; exec " + shardline() +
                                        " gen-model --dim 64 --hidden 160 --layers 2 --heads 4 --vocab 300 --seq 32 "
                                        "--out " + (dir / "cut.bin").string() + "\"");
  EXPECT_EQ(cut.exit_code, 4) << cut.err;
  EXPECT_NE(cut.err.find("failed"), std::string::npos) << cut.err;
  const std::vector<std::string> left = files_in(dir);
  EXPECT_TRUE(left.empty()) << "left behind: " << (left.empty() ? "" : left.front());
}

TEST_F(Cli, GenModelWritesOnlyRegularFilesAndNeverTheSamePathTwice) {
  // Its files are renamed into place, which replaced a device or FIFO at --out with the model (as root,
  // --out /dev/null replaced the system's /dev/null), and --tokenizer-out equal to --out lost the model.
  namespace fs = std::filesystem;
  const fs::path dir = path("gen-targets");
  fs::create_directories(dir);
  const std::string gen = "gen-model --dim 64 --hidden 128 --layers 2 --heads 4 --vocab 300 --seq 32 --out ";
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0644), 0);
  fs::create_directories(dir / "folder.bin");
  expect_clean_failure(gen + (dir / "fifo").string(), 2, "is a FIFO");
  EXPECT_TRUE(fs::is_fifo(dir / "fifo"));
  expect_clean_failure(gen + (dir / "folder.bin").string(), 2, "is a folder");
  expect_clean_failure(gen + (dir / "m.bin").string() + " --tokenizer-out " + (dir / "fifo").string(), 2, "is a FIFO");
  expect_clean_failure(gen + (dir / "m.bin").string() + " --tokenizer-out " + (dir / "m.bin").string(), 2,
                       "--out and --tokenizer-out are both");
  expect_clean_failure(gen + "''", 2, "--out needs a file name");
  expect_clean_failure(gen + (dir / "m.bin").string() + " --tokenizer-out ''", 2, "--tokenizer-out needs a file name");
  EXPECT_FALSE(fs::exists(dir / "m.bin"));
  // A link is written through: the file it names gets the model, the link stays, and the tokenizer goes
  // beside the link, where run --model finds it.
  { std::ofstream(dir / "target.bin") << "old"; }
  fs::create_symlink("target.bin", dir / "link.bin");
  ASSERT_EQ(run_process(shardline() + " " + gen + (dir / "link.bin").string()).exit_code, 0);
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir / "link.bin")));
  EXPECT_GT(fs::file_size(dir / "target.bin"), 3u);
  EXPECT_TRUE(fs::is_regular_file(dir / "link.tokenizer.bin"));
  EXPECT_EQ(run_process(shardline() + " run --steps 2 --model " + (dir / "link.bin").string()).exit_code, 0);
  // A link to a file not made yet makes that file (the link was replaced); a loop of links is refused.
  fs::create_symlink("later.bin", dir / "dangling.bin");
  ASSERT_EQ(run_process(shardline() + " " + gen + (dir / "dangling.bin").string()).exit_code, 0);
  EXPECT_TRUE(fs::is_symlink(fs::symlink_status(dir / "dangling.bin")));
  EXPECT_TRUE(fs::is_regular_file(dir / "later.bin"));
  fs::create_symlink("loop.bin", dir / "loop.bin");
  expect_clean_failure(gen + (dir / "loop.bin").string(), 2, "is a link that does not lead to a file (a loop of links)");
}

// A signal during the write (SIGTERM here; SIGINT from a terminal's Ctrl-C is handled alike) removes the
// part files and still ends the process by that signal (exit 128 + 15 from the shell). The writer is
// stopped (SIGSTOP) as soon as its part file shows, and signalled only if that file is still there, so a
// loaded machine cannot let it finish first; a write that finished before the stop is tried again.
TEST_F(Cli, GenModelKilledMidWriteLeavesNoPartFile) {
  namespace fs = std::filesystem;
  const fs::path dir = path("killed");
  fs::create_directories(dir);
  const std::string script = gen_model_caught_mid_write(dir.string(), "kill -STOP $pid",
                                                        "kill -TERM $pid; kill -CONT $pid; wait $pid; echo $?",
                                                        "kill -CONT $pid; wait $pid");
  const ProcessResult r = run_process("bash -c " + shell_quote(script), 120);
  EXPECT_EQ(r.out, "143\n") << r.err;
  const std::vector<std::string> left = files_in(dir);
  EXPECT_TRUE(left.empty()) << "left behind: " << (left.empty() ? "" : left.front());
}

// SIGKILL leaves a part file no handler could remove (for a large model, hundreds of GB): the next gen-model
// for that name removes it and says so. Part files of a live process, one locked by a writer whose process
// number means nothing here (another PID namespace of this host), one named for another host (a folder
// several hosts share) and names that only look like part files stay.
TEST_F(Cli, GenModelRemovesThePartFileOfAWriterKilledOutright) {
  namespace fs = std::filesystem;
  const fs::path dir = path("sigkilled");
  fs::create_directories(dir);
  const std::string d = dir.string();
  const std::string script = gen_model_caught_mid_write(d, "kill -KILL $pid; wait $pid", "echo killed", "true");
  const ProcessResult killed = run_process("bash -c " + shell_quote(script), 120);
  ASSERT_EQ(killed.out, "killed\n") << killed.err;
  std::string stale;
  for (const std::string& name : files_in(dir)) {
    if (name.starts_with("m.bin.tmp.")) stale = name;
  }
  ASSERT_FALSE(stale.empty());
  // Kept: one for this (live) test process, one of another host with the killed writer's number.
  char host[256] = {};
  ASSERT_EQ(gethostname(host, sizeof(host) - 1), 0);
  std::string host_field(host);
  std::replace(host_field.begin(), host_field.end(), '.', '_');
  const std::string live = fmt::format("m.bin.tmp.{}.{}.7", host_field, getpid());
  const std::string pid_and_slot = stale.substr(stale.rfind('.', stale.rfind('.') - 1) + 1);  // "<pid>.<n>"
  const std::string dead_pid = pid_and_slot.substr(0, pid_and_slot.find('.'));
  const std::string other_host = "m.bin.tmp.elsewhere." + pid_and_slot;
  const std::string locked = fmt::format("m.bin.tmp.{}.{}.99", host_field, dead_pid);
  const std::string not_ours = fmt::format("m.bin.tmp.{}.{}.backup", host_field, dead_pid);
  std::ofstream(dir / live) << "writing";
  std::ofstream(dir / other_host) << "writing";
  std::ofstream(dir / not_ours) << "a user's file";
  std::ofstream(dir / locked) << "writing";
  const int lock_fd = open((dir / locked).c_str(), O_RDONLY);
  ASSERT_GE(lock_fd, 0);
  ASSERT_EQ(flock(lock_fd, LOCK_EX), 0);  // held by this test process while gen-model runs
  const ProcessResult again = run_process(shardline() + " gen-model --dim 64 --hidden 128 --layers 2 --heads 4 --vocab 512 "
                                          "--seq 64 --out " + d + "/m.bin");
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_NE(again.err.find("removed '" + (dir / stale).string() + "'"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("killed before it finished"), std::string::npos) << again.err;
  EXPECT_FALSE(fs::exists(dir / stale));
  close(lock_fd);
  EXPECT_TRUE(fs::exists(dir / live));
  EXPECT_TRUE(fs::exists(dir / other_host));
  EXPECT_TRUE(fs::exists(dir / not_ours));
  EXPECT_TRUE(fs::exists(dir / locked)) << "a locked part file has a writer, whatever its process number says";
  EXPECT_TRUE(fs::exists(dir / "m.bin"));
}

TEST_F(Cli, NanWeightsAreWarnedAboutOnceByOneRank) {
  // llama2.c's rules pick token 0 from NaN logits: the run goes on (the reference does), but says why its
  // text is meaningless, once, from the rank that writes the output, on one rank and on tp 2 x pp 2.
  const std::string model = path("nan.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 2 --heads 2 --vocab 300 --seq 16 --out " +
                        model).exit_code, 0);
  const std::string args = " run --model " + model + " --prompt hello --steps 4";
  const std::string warning = "hidden state holds NaN or Inf";
  const ProcessResult clean = run_process(shardline() + args, 60);
  ASSERT_EQ(clean.exit_code, 0) << clean.err;
  EXPECT_EQ(clean.err.find(warning), std::string::npos) << clean.err;
  {
    // One NaN in layer 0's attention RMSNorm weight, right after the (vocab, dim) embedding table.
    std::fstream file(model, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(7 * sizeof(std::int32_t) + 300 * 32 * sizeof(float));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    file.write(reinterpret_cast<const char*>(&nan), sizeof(nan));
  }
  for (const std::string& launch : {shardline(), kMpirun + "4 " + shardline()}) {
    const std::string layout = launch == shardline() ? "" : " --tp 2 --pp 2";
    const ProcessResult r = run_process(launch + args + layout, 120);
    EXPECT_EQ(r.exit_code, 0) << launch << "\n" << r.err;
    EXPECT_EQ(count_of(r.err, warning), 1u) << launch << "\n" << r.err;
    // Counted alike on every layout (the last pipeline stage said "after 0 tokens").
    EXPECT_NE(r.err.find("sequence 0's hidden state holds NaN or Inf at its generated token 1:"), std::string::npos)
        << r.err;
  }
  // A NaN inside a weight matrix (layer 0's wq, after the embedding and the layers' attention RMSNorm
  // weights), held in each weight dtype: int8 gives its group a NaN scale, so it warns as fp32 and bf16 do
  // (it used to turn the NaN into a finite code, or an Inf into a NaN converted to an int, on every ISA).
  const std::string in_matrix = path("nan-matrix.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 2 --heads 2 --vocab 300 --seq 16 --out " +
                        in_matrix).exit_code, 0);
  {
    std::fstream file(in_matrix, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(7 * sizeof(std::int32_t) + (300 * 32 + 2 * 32 + 5) * sizeof(float));
    const float inf = std::numeric_limits<float>::infinity();
    file.write(reinterpret_cast<const char*>(&inf), sizeof(inf));
  }
  for (const char* dtype : {"fp32", "bf16", "int8"}) {
    const ProcessResult r = run_process(shardline() + " run --model " + in_matrix + " --prompt hello --steps 4 "
                                        "--weights-dtype " + dtype, 120);
    EXPECT_EQ(r.exit_code, 0) << dtype << "\n" << r.err;
    EXPECT_EQ(count_of(r.err, warning), 1u) << dtype << "\n" << r.err;
  }
  // A NaN in the final RMSNorm weight leaves every hidden state finite and every logit NaN (from a fuzzing
  // pass: the run printed <unk>s and said nothing); an Inf there makes them +-Inf, whose greedy winner is
  // +Inf. The weight sits before the two RoPE tables (seq x head_size / 2 floats each) at the file's end;
  // greedy picks inside the classifier, sampling reads the logits.
  const std::string logits_warning = "logits hold NaN or Inf";
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    const std::string final_bad = path("bad-final.bin");
    ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 2 --heads 2 --vocab 300 --seq 16 "
                          "--out " + final_bad).exit_code, 0);
    {
      std::fstream file(final_bad, std::ios::in | std::ios::out | std::ios::binary);
      file.seekp(static_cast<std::streamoff>(std::filesystem::file_size(final_bad)) - (2 * 16 * 8 + 32) * 4 + 4 * 5);
      file.write(reinterpret_cast<const char*>(&bad), sizeof(bad));
    }
    const std::string final_args = " run --model " + final_bad + " --prompt hello --steps 4";
    for (const std::string& command : {shardline() + final_args, kMpirun + "4 " + shardline() + final_args + " --tp 2 --pp 2",
                                       shardline() + final_args + " --temperature 1"}) {
      const ProcessResult r = run_process(command, 120);
      EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.err;
      EXPECT_EQ(count_of(r.err, logits_warning), 1u) << bad << ": " << command << "\n" << r.err;
      EXPECT_EQ(r.err.find(warning), std::string::npos) << command << "\n" << r.err;  // the hidden state is finite
    }
  }
  // A NaN in one classifier row past the first (an unshared classifier is the file's last vocab x dim floats):
  // every step's logit for that token is NaN, which argmax skips, so greedy decoding picked finite tokens and
  // said nothing. It warns now, on one rank and over TP, where each rank picks from its own vocabulary slice.
  const std::string nan_row = path("nan-row.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 32 --hidden 64 --layers 2 --heads 2 --vocab 300 --seq 16 "
                        "--unshared-classifier --out " + nan_row).exit_code, 0);
  {
    std::fstream file(nan_row, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(std::filesystem::file_size(nan_row)) - (300 - 250) * 32 * 4 + 4 * 3);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    file.write(reinterpret_cast<const char*>(&nan), sizeof(nan));
  }
  const std::string row_args = " run --model " + nan_row + " --prompt hello --steps 4";
  for (const std::string& command : {shardline() + row_args, kMpirun + "2 " + shardline() + row_args + " --tp 2",
                                     kMpirun + "2 " + shardline() + row_args + " --pp 2",
                                     shardline() + row_args + " --dump-logits " + path("nan-row.f32")}) {
    const ProcessResult r = run_process(command, 120);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.err;
    EXPECT_EQ(count_of(r.err, "logits hold NaN"), 1u) << command << "\n" << r.err;
    // The picks stand (argmax skips the NaN): the warning says that token is never picked, not that the text
    // is meaningless.
    EXPECT_NE(r.err.find("sequence 0's logits hold NaN at its generated token 1: greedy decoding skips them"),
              std::string::npos)
        << command << "\n" << r.err;
    EXPECT_EQ(r.err.find("meaningless"), std::string::npos) << command << "\n" << r.err;
  }
}

TEST_F(Cli, ASequenceEndedByBosSaysSo) {
  // The model samples BOS (llama2.c's end of text) at once: the run printed its prompt and nothing more,
  // with no word on why. A llama2.c checkpoint made for it: its layers add nothing (wo and w2 are zero), so
  // the final hidden state is the last token's embedding, (1, 0, ...) for every token but BOS's (2, 0, ...),
  // and the shared classifier scores BOS highest.
  constexpr int dim = 8, hidden = 16, vocab = 300, seq = 16, heads = 2;
  const std::string tokenizer_source = path("bos-ref.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 8 --hidden 16 --layers 1 --heads 2 --vocab 300 --seq 16 --out " +
                        tokenizer_source).exit_code, 0);
  const std::string model = path("bos.bin");
  {
    std::ofstream out(model, std::ios::binary);
    const std::int32_t header[7] = {dim, hidden, 1, heads, heads, vocab, seq};
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    auto floats = [&](std::size_t n, float value) {
      const std::vector<float> v(n, value);
      out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * sizeof(float)));
    };
    for (int token = 0; token < vocab; ++token) {
      floats(1, token == 1 ? 2.0f : 1.0f);
      floats(dim - 1, 0.0f);
    }
    floats(dim, 1.0f);                  // rms_att
    floats(4 * dim * dim, 0.0f);        // wq, wk, wv, wo
    floats(dim, 1.0f);                  // rms_ffn
    floats(3 * hidden * dim, 0.0f);     // w1, w2, w3
    floats(dim, 1.0f);                  // rms_final
    floats(seq * dim / heads, 0.0f);    // the RoPE tables: seq x head_size / 2, twice
  }
  const std::string tokenizer = " --tokenizer " + runtime::default_tokenizer_path_for(tokenizer_source);
  ProcessResult r = run_process(shardline() + " run --model " + model + tokenizer + " --prompt hi --steps 5", 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the model ended the text (sampled BOS, llama2.c's end of text) after 0 of --steps 5 tokens"),
            std::string::npos) << r.err;
  r = run_process(shardline() + " run --model " + model + tokenizer + " --prompt hi --steps 5 --batch 3", 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("3 of 3 sequences ended early: the model sampled BOS"), std::string::npos) << r.err;
}

TEST_F(Cli, AModelTruncatedUnderARunEndsItWithOneLine) {
  // The run maps its weights from the file: truncating it (or `cp` over it) turns the next read into SIGBUS,
  // which killed the rank with nothing said. The run is stopped once it has the file mapped, the file cut,
  // the run continued.
  const std::string model = path("cut.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 128 --hidden 384 --layers 4 --heads 4 --vocab 2048 --seq 512 "
                        "--out " + model).exit_code, 0);
  const std::string script =
      shardline() + " run --model " + model + " --steps 500 --threads 1 >/dev/null 2>" + path("cut.err") + " & pid=$!\n"
      "for i in $(seq 2000); do grep -q " + model + " /proc/$pid/maps 2>/dev/null && break; sleep 0.002; done\n"
      "kill -STOP $pid; truncate -s 1000 " + model + "; kill -CONT $pid; wait $pid; echo rc=$?\n";
  const ProcessResult r = run_process("bash -c " + shell_quote(script), 60);
  const std::string err = read_text_file(path("cut.err"));
  EXPECT_EQ(r.out, "rc=3\n") << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n') - (err.find("info:") != std::string::npos ? 1 : 0), 1) << err;
  EXPECT_NE(err.find("error: "), std::string::npos) << err;
  EXPECT_NE(err.find(model), std::string::npos) << err;
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST_F(Cli, BadInputUnderMpirunEndsTheJobWithTheMessage) {
  const ProcessResult r = run_process(kMpirun + "1 " + shardline() + " run --model " + path("nope.bin"), 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("nope.bin"), std::string::npos) << r.err;
}

TEST_F(Cli, RanksGivenDifferentModelsOrRequestsStopAtStartUp) {
  // An MPMD launch whose ranks disagree must not wait for --comm-timeout in its first collective, and the
  // error names what differs, with both values.
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.bin"));
  // Two files of one shape and size with other weights: a stale copy at the same path on another host.
  const std::string gen = shardline() + " gen-model --dim 64 --hidden 160 --layers 2 --heads 4 --kv-heads 2 --vocab 400 "
                                        "--seq 64 --out ";
  ASSERT_EQ(run_process(gen + path("same.bin") + " --seed 1").exit_code, 0);
  ASSERT_EQ(run_process(gen + path("other.bin") + " --seed 2").exit_code, 0);
  const std::string tiny = "--model " + model_file("tiny-32k.bin") + " --tokenizer " + model_file("tokenizer.bin");
  const std::string common = " --tp 2 --comm-timeout 60 --steps 5";
  for (const auto& [first, second, error] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {tiny, "--model " + model_file("mini-gqa.bin") + " --tokenizer " + model_file("tokenizer.bin"),
            "[r1] error: this rank's model shape differs from rank 0's ('dim "},
           {"--model " + path("same.bin"), "--model " + path("other.bin") + " --tokenizer " + path("same.tokenizer.bin"),
            "[r1] error: this rank's model file contents (a digest of 512 KiB sampled across it) differs from rank 0's"},
           {tiny, tiny + " --prompt other",
            "[r1] error: this rank's prompt differs from rank 0's ('other' here, 'Once upon a time' on rank 0); give "
            "every rank the same model file, prompts and layout flags"},
           {tiny, tiny + " --weights-dtype bf16",
            "[r1] error: this rank's --weights-dtype differs from rank 0's ('bf16' here, 'fp32' on rank 0)"},
           // Flags that end one rank early would leave the others waiting too.
           {tiny, tiny + " --print-config",
            "[r1] error: this rank's --print-config differs from rank 0's ('given' here, 'not given' on rank 0)"},
           {tiny, tiny + " --help", "[r1] error: this rank's --help differs from rank 0's ('given' here, 'not given' on rank 0)"}}) {
    const ProcessResult r = run_process(kMpirun + "1 " + shardline() + " run " + first + common + " : -np 1 " +
                                        shardline() + " run " + second + common, 50);
    EXPECT_EQ(r.exit_code, 2) << second << "\n" << r.err;
    EXPECT_EQ(count_of(r.err, error), 1u) << r.err;
  }
  // Rank 0 alone differs from the other two: the line says rank 0 is the one to fix, not rank 1.
  const std::string three = " --tp 1 --pp 3 --comm-timeout 60 --steps 5 ";
  const ProcessResult r = run_process(kMpirun + "1 " + shardline() + " run " + tiny + three + "--kv-dtype fp16 : -np 2 " +
                                      shardline() + " run " + tiny + three, 50);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(count_of(r.err, "[r1] error: rank 0's --kv-dtype differs from every other rank's ('fp16' on rank 0, 'auto' "
                            "on rank 1 and the rest)"),
            1u)
      << r.err;
  // Ranks 1 and 2 differ from rank 0 in different fields: rank 1 says its own, not that rank 0 is alone.
  const ProcessResult split = run_process(kMpirun + "1 " + shardline() + " run " + tiny + three + ": -np 1 " + shardline() +
                                          " run " + tiny + three + "--kv-dtype fp16 : -np 1 " + shardline() + " run " +
                                          tiny + three + "--prompt other", 50);
  EXPECT_EQ(split.exit_code, 2) << split.err;
  EXPECT_EQ(count_of(split.err, "[r1] error: this rank's --kv-dtype differs from rank 0's ('fp16' here, 'auto' on rank 0)"),
            1u)
      << split.err;
}

TEST_F(Cli, ARankStuckAtStartUpFailsTheJobAfterTheCommTimeout) {
  // Rank 1 reads its prompts from a pipe nobody writes, with no time limit of its own (a stand-in for a hung
  // file system): rank 0 used to wait for it in the start-up agreement forever.
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const std::string fifo = path("stuck");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string common = " run --model " + model_file("tiny-32k.bin") + " --tokenizer " + model_file("tokenizer.bin");
  const ProcessResult r = run_process(kMpirun + "1 " + shardline() + common + " --comm-timeout 2 : -np 1 " + shardline() +
                                          common + " --comm-timeout inf --prompts-file " + fifo,
                                      60);
  EXPECT_EQ(r.exit_code, 5) << r.err;  // a communication failure, not the test's time limit (124)
  EXPECT_NE(r.err.find("[r0] error: a rank did not arrive within 2 s (--comm-timeout)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 does not answer within 2 s"), std::string::npos) << r.err;  // comm/liveness.h
}

TEST_F(Cli, APromptsPipeNobodyWritesOrWithoutEndFailsInsteadOfHolding) {
  // Every rank read its prompts from the FIFO and waited for a writer, so no rank reached a wait that could
  // time out; /dev/zero grew in memory without end; --dump-logits onto the prompts file overwrote them.
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const std::string fifo = path("nobody-writes");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // (5 s: the ranks' reads end at about the same time, well within the start-up agreement's own 5 s)
  const std::string args = "run --model " + model_file("tiny-32k.bin") + " --steps 2 --comm-timeout 5 --prompts-file ";
  expect_clean_failure(args + fifo, 4, "--prompts-file '" + fifo + "' gave nothing for 5 s (--comm-timeout)");
  const ProcessResult both = run_process(kMpirun + "2 " + shardline() + " " + args + fifo, 60);
  EXPECT_EQ(both.exit_code, 4) << both.err;  // not the test's time limit (124)
  EXPECT_EQ(count_of(both.err, "gave nothing for 5 s"), 1u) << both.err;
  expect_clean_failure(args + "/dev/zero", 4, "holds more than 256 MiB");
  // A regular file past the limit is refused by its size, unread.
  const std::string huge = path("huge-prompts.txt");
  { std::ofstream(huge, std::ios::binary).seekp((std::streamoff{256} << 20) + 1) << 'x'; }
  expect_clean_failure(args + huge, 4, "holds more than 256 MiB");
  // Alone, an empty input is just that (the mpirun hint is for a job's later tasks).
  const ProcessResult empty = run_process(shardline() + " " + args + "/dev/null", 60);
  EXPECT_EQ(empty.exit_code, 2) << empty.err;
  EXPECT_NE(empty.err.find("holds no prompt (one per line)\n"), std::string::npos) << empty.err;
  const std::string prompts = path("prompts.txt");
  { std::ofstream(prompts) << "A\n"; }
  expect_clean_failure(args + prompts + " --dump-logits " + prompts, 2, "is the run's own prompts file");
  std::ifstream kept(prompts);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "A\n");
}

TEST_F(Cli, ATaskThatNeverReachesMpiStartUpFailsTheJobAfterTheCommTimeout) {
  // The second task sleeps before it starts shardline: Open MPI's MPI_Init waits for every task, so the first
  // sat inside it until the job's time limit. Now it leaves after --comm-timeout with one line and exit 5.
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const std::string args = " run --model " + model_file("tiny-32k.bin") + " --steps 3 --comm-timeout 3";
  const ProcessResult r = run_process(kMpirun + "1 " + shardline() + args + " : -np 1 bash -c " +
                                          shell_quote("sleep 30; exec " + shardline() + args),
                                      60);
  EXPECT_EQ(r.exit_code, 5) << r.err;  // not the test's time limit (124)
  EXPECT_NE(r.err.find("[r0] error: MPI start-up (MPI_Init and its first collectives) did not complete within 3 s "
                       "(--comm-timeout): a task of this job has not reached it"),
            std::string::npos)
      << r.err;
}

TEST_F(Cli, ATimeoutNamesTheRankThatIsStuckNotTheNeighbourWaitingForIt) {
  // pp=3 and rank 0 stopped mid-run (SIGSTOP, by the shell that started it): rank 1 waits for rank 0, and
  // rank 2 for rank 1, which is healthy. Every error line must name rank 0 as the one that does not answer.
  const std::string model = path("long.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 256 --hidden 700 --layers 3 --heads 8 --kv-heads 4 --vocab 1000 "
                                      "--seq 4096 --out " + model).exit_code, 0);
  const std::string args = " run --model " + model + " --steps 4000 --batch 4 --prompt hi --pp 3 --threads 1 --json "
                           "--comm-timeout 3";
  const std::string stopped_rank0 = "bash -c " + shell_quote(shardline() + args + " & pid=$!; sleep 3; kill -STOP $pid; "
                                                                               "wait $pid");
  const ProcessResult r = run_process(kMpirun + "1 " + stopped_rank0 + " : -np 2 " + shardline() + args, 90);
  EXPECT_EQ(r.exit_code, 5) << r.err;
  int errors = 0;
  for (std::size_t at = r.err.find("error:"); at != std::string::npos; at = r.err.find("error:", at + 1)) {
    const std::string line = r.err.substr(at, r.err.find('\n', at) - at);
    if (line.find("timed out") == std::string::npos && line.find("did not arrive") == std::string::npos) continue;
    ++errors;
    EXPECT_NE(line.find("rank 0 does not answer within 2 s (stopped, stuck outside MPI, or dead), every other rank does"),
              std::string::npos) << line;
  }
  EXPECT_GE(errors, 1) << r.err;
}

TEST_F(Cli, APlanMeasuredOnAnOversubscribedHostSaysItsPredictionIsNoisy) {
  // Ranks taking turns on fewer CPUs make the link probe time the scheduler: the plan line says so, and only
  // then.
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  const std::string args = " run --model " + model_file("tiny-32k.bin") + " --steps 2";
  for (const int ranks : {2, 2 * cpus}) {
    if (ranks > 8) continue;  // (a host of more than 4 CPUs runs only the first case)
    const ProcessResult r = run_process(kMpirun + std::to_string(ranks) + " " + shardline() + args, 120);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    ASSERT_NE(r.err.find("info: plan auto: "), std::string::npos) << r.err;
    const bool noisy = r.err.find(fmt::format("the {} ranks on this host outnumber its {} CPUs", ranks, cpus)) !=
                       std::string::npos;
    EXPECT_EQ(noisy, ranks > cpus) << ranks << " ranks on " << cpus << " CPUs:\n" << r.err;
  }
}

TEST_F(Cli, MoreThreadsThanCoresAreWarnedAbout) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const std::string args = " run --model " + model_file("tiny-32k.bin") + " --steps 3 --threads ";
  const ProcessResult many = run_process(shardline() + args + std::to_string(cores + 1), 60);
  EXPECT_EQ(many.exit_code, 0) << many.err;
  EXPECT_NE(many.err.find(fmt::format("warn: --threads {} is more than the ", cores + 1)), std::string::npos) << many.err;
  const ProcessResult enough = run_process(shardline() + args + "1", 60);
  EXPECT_EQ(enough.err.find("is more than the"), std::string::npos) << enough.err;
}

TEST_F(Cli, RunningOutOfMemoryIsAMissingResource) {
  // 1.5 million requests under a 1.2 GB address-space limit: exit 4 and a line that says what ran out, not
  // "unexpected: std::bad_alloc" and exit 1. (About 1.7 GB by run's own estimate, which refuses up front only
  // what the host's available memory cannot hold: Cli.UnknownFlagsAndCommands has that case.)
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const ProcessResult r = run_process("bash -c " + shell_quote("ulimit -v 1200000; exec " + shardline() + " run --model " +
                                                               model_file("tiny-32k.bin") + " --batch 1500000 --steps 2"), 60);
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_NE(r.err.find("error: out of memory (is --batch"), std::string::npos) << r.err;
}

TEST_F(Cli, AnInfiniteCommTimeoutNeverExpires) {
  // The deadline of a huge timeout overflowed the clock and lay in the past: every wait failed at once.
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  const std::string args = " run --model " + model_file("tiny-32k.bin") + " --tokenizer " + model_file("tokenizer.bin") +
                           " --steps 40 --json --tp 2 --comm-timeout ";
  const ProcessResult one = run_process(shardline() + " run --model " + model_file("tiny-32k.bin") + " --tokenizer " +
                                        model_file("tokenizer.bin") + " --steps 40 --json", 60);
  ASSERT_EQ(one.exit_code, 0) << one.err;
  for (const std::string timeout : {"inf", "1e12"}) {
    const ProcessResult r = run_process(kMpirun + "2 " + shardline() + args + timeout, 60);
    EXPECT_EQ(r.exit_code, 0) << timeout << "\n" << r.err;
    EXPECT_EQ(r.out, one.out) << timeout;
  }
  expect_clean_failure(args.substr(1) + "nan", 2, "--comm-timeout must be at least 1 second");
  // Below a second MPI's own start-up outlasted it, and every task printed its own start-up timeout: refused
  // by one rank, under mpirun too.
  expect_clean_failure(args.substr(1) + "0.001", 2, "--comm-timeout must be at least 1 second");
  const ProcessResult tiny = run_process(kMpirun + "2 " + shardline() + args + "0.001", 60);
  EXPECT_EQ(tiny.exit_code, 2) << tiny.err;
  EXPECT_EQ(count_of(tiny.err, "error:"), 1u) << tiny.err;
  // More micro-batches than sequences run as that many, and say so.
  const ProcessResult fewer = run_process(shardline() + " run --model " + model_file("tiny-32k.bin") + " --tokenizer " +
                                          model_file("tokenizer.bin") + " --steps 2 --micro-batches 5", 60);
  EXPECT_EQ(fewer.exit_code, 0) << fewer.err;
  EXPECT_NE(fewer.err.find("--micro-batches 5 is more than the 1 sequence: run as 1"), std::string::npos) << fewer.err;
}

TEST_F(Cli, HelpDescribesEveryCommand) {
  const ProcessResult top = run_process(shardline() + " --help");
  EXPECT_EQ(top.exit_code, 0);
  for (const char* word : {"run", "gen-model", "Exit codes"}) EXPECT_NE(top.out.find(word), std::string::npos) << word;
  const ProcessResult run = run_process(shardline() + " run --help");
  EXPECT_EQ(run.exit_code, 0);
  for (const char* flag : {"--model", "--tokenizer", "--prompt", "--steps", "--temperature", "--top-p", "--seed",
                           "--threads", "--json"}) {
    EXPECT_NE(run.out.find(flag), std::string::npos) << flag;
  }
}

}  // namespace
}  // namespace shardline::test
