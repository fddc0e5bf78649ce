// llama2.c's versioned model files (export.py --version 1 and 2) through the real binary: a version-1 file
// is its legacy checkpoint with another header and order, so it gives the goldens; a version-2 file (Q8_0,
// groups running across rows) gives the tokens of a legacy checkpoint of the values its codes decode to, on
// one rank and on every kind of layout; a damaged one is refused with exit code 3 before anything runs.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/cli_fixture.h"
#include "tests/support/golden_run.h"
#include "tests/support/llama2c_export.h"
#include "tests/support/models.h"
#include "tests/support/process.h"

namespace shardline::test {
namespace {

class Llama2cExport : public CliTest {
 protected:
  std::string shardline() const { return shardline_binary(); }

  // The ids `run --json` generated, after checking the run succeeded.
  static nlohmann::json ids_of(const ProcessResult& r, const std::string& what) {
    EXPECT_EQ(r.exit_code, 0) << what << "\n" << r.err;
    if (r.exit_code != 0) return nullptr;
    return nlohmann::json::parse(r.out)["ids"];
  }
};

TEST_F(Llama2cExport, AVersion1FileOfAReferenceModelGivesItsGoldens) {
  for (const std::string model : {"tiny-32k.bin", "mini-gqa.bin"}) {  // a shared and an unshared classifier
    SHARDLINE_REQUIRE_MODEL_FILE(model_file(model));
    const std::string v1 = path("v1-" + model);
    write_llama2c_export(model_file(model), v1, {.version = 1});
    GoldenRun golden = prepare_golden_run(model, path(model + ".prompts"));
    const std::string legacy_flag = "--model " + model_file(model);
    ASSERT_EQ(golden.flags.find(legacy_flag), 0u) << golden.flags;
    golden.flags.replace(0, legacy_flag.size(), "--model " + v1);
    expect_goldens(run_process(shardline() + " run " + golden.flags), golden.goldens, "version 1 of " + model);
    expect_goldens(run_process(mpirun(2) + shardline() + " run " + golden.flags + " --pp 2"), golden.goldens,
                   "version 1 of " + model + ", pp=2");
  }
}

TEST_F(Llama2cExport, AVersion2FileGivesTheTokensOfItsDecodedValuesOnEveryLayout) {
  // hidden 168 is no multiple of the group of 64, so w2's groups run across its rows (a TP rank decodes w2's
  // rows whole and takes its columns from them); the classifier is unshared, so it is a matrix of its own.
  const std::string model = path("m.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 64 --hidden 168 --layers 2 --heads 4 --kv-heads 2 --vocab 300 "
                                      "--seq 40 --seed 9 --unshared-classifier --out " + model).exit_code, 0);
  const std::string v2 = path("m-q80.bin"), decoded = path("m-decoded.bin");
  EXPECT_EQ(write_llama2c_export(model, v2, {.version = 2}, decoded), 64);
  std::filesystem::copy_file(path("m.tokenizer.bin"), path("m-q80.tokenizer.bin"));
  std::filesystem::copy_file(path("m.tokenizer.bin"), path("m-decoded.tokenizer.bin"));
  const std::string args = " run --json --steps 24 --prompt hello --model ";
  auto logits_of = [&](const std::string& file) {
    const ProcessResult r = run_process(shardline() + args + file + " --threads 2 --dump-logits " + path("logits"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(path("logits"), std::ios::binary);
    return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  // Every logit of every step, bit for bit: the same values, the same arithmetic.
  const std::vector<char> decoded_logits = logits_of(decoded);
  ASSERT_EQ(decoded_logits.size(), 24u * 300u * sizeof(float));
  EXPECT_EQ(logits_of(v2), decoded_logits);
  EXPECT_NE(logits_of(model), decoded_logits) << "the quantisation must change the logits, or this shows nothing";
  const nlohmann::json expected = ids_of(run_process(shardline() + args + decoded + " --threads 1"), "decoded");
  ASSERT_FALSE(expected.is_null());
  const ProcessResult one = run_process(shardline() + args + v2 + " --threads 2");
  EXPECT_EQ(ids_of(one, "version 2, one rank"), expected);
  // Held in fp32 it takes about four times its file's bytes: one line names the compact choice.
  EXPECT_EQ(count_of(one.err, "holds Q8_0 (llama2.c) weights (8.5 bits each)"), 1u) << one.err;
  for (const std::string layout : {"--tp 2", "--pp 2", "--tp 2 --pp 2"}) {
    const int ranks = layout == "--tp 2 --pp 2" ? 4 : 2;
    EXPECT_EQ(ids_of(run_process(mpirun(ranks) + shardline() + args + v2 + " --threads 1 " + layout), layout),
              expected) << layout;
  }
  // Converted to int8 at load like any file: the tokens of the decoded checkpoint converted alike.
  EXPECT_EQ(ids_of(run_process(shardline() + args + v2 + " --threads 1 --weights-dtype int8"), "int8"),
            ids_of(run_process(shardline() + args + decoded + " --threads 1 --weights-dtype int8"), "decoded int8"));
}

TEST_F(Llama2cExport, ADamagedExportIsRefusedBeforeAnythingRuns) {
  const std::string model = path("m.bin");
  ASSERT_EQ(run_process(shardline() + " gen-model --dim 64 --hidden 160 --layers 2 --heads 4 --vocab 300 --seq 40 "
                                      "--out " + model).exit_code, 0);
  const std::string v2 = path("v2.bin");
  write_llama2c_export(model, v2, {.version = 2});
  std::ifstream in(v2, std::ios::binary);
  const std::vector<char> good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto variant = [&](const std::string& name, auto&& edit) {
    std::vector<char> bytes = good;
    edit(bytes);
    std::ofstream(path(name), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path(name);
  };
  auto put_int = [](std::vector<char>& bytes, std::size_t at, std::int32_t value) {
    std::memcpy(bytes.data() + at, &value, sizeof value);
  };
  struct Case {
    std::string file, expect;
  };
  const std::vector<Case> cases = {
      {variant("v3.bin", [&](auto& b) { put_int(b, 4, 3); }), "a llama2.c export of version 3"},
      {variant("group0.bin", [&](auto& b) { put_int(b, 37, 0); }), "group size 0 does not divide"},
      {variant("group48.bin", [&](auto& b) { put_int(b, 37, 48); }), "group size 48 does not divide"},
      {variant("short.bin", [&](auto& b) { b.pop_back(); }), "is truncated"},
      {variant("long.bin", [&](auto& b) { b.push_back(0); }), "is longer than its header says"},
      {variant("header.bin", [&](auto& b) { b.resize(100); }), "shorter than its 256-byte header"},
      {variant("flag.bin", [&](auto& b) { b[36] = 2; }), "shared-classifier flag is 2"},
      {variant("heads.bin", [&](auto& b) { put_int(b, 20, 5); }), "n_heads=5 does not divide dim=64"},
      // Another layout of the same size (all codes first, say): what sits where the embedding's first scale
      // belongs (after 256 header bytes, five norms of 64 floats and 300 x 64 codes) is no scale.
      {variant("layout.bin",
               [&](auto& b) {
                 const float minus_one = -1.0f;
                 std::memcpy(b.data() + 256 + 5 * 64 * 4 + 300 * 64, &minus_one, 4);
               }),
       "its scale 0 at byte 20736 is -1, not a scale"},
  };
  for (const Case& c : cases) {
    for (const std::string command : {" run --prompt hi --steps 2 --model ", " plan --model "}) {
      expect_one_error_line(run_process(shardline() + command + c.file), 3, c.expect);
    }
  }
}

}  // namespace
}  // namespace shardline::test
