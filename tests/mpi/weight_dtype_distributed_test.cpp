// Every weight dtype (fp32, bf16, int8) and KV cache dtype (fp32, fp16, int8), on every TP / PP layout under
// real mpirun, against one rank with the same dtypes: the same logits, bit for bit, so the same tokens, greedy
// or sampled. A TP rank converts only its own slices (bf16 rounds each weight alone; int8 groups fall inside
// one rank's columns: runtime::WoInput, partition::hidden_block), and the row-parallel matmuls, wo and w2,
// add their partial sums over k in the same segments in the same order on every layout (partition::
// n_reduction_segments, kernels::cpu::matmul_segments). Before the segments, layouts differed from one rank by
// float rounding (fp32: 1e-7 of the largest logit), which int8 activations and fp16 or int8 caches turned into
// quantisation noise (up to 2%: a value one ulp apart taking the next code), and tokens flipped at near ties:
// int8 with an fp16 cache on mini-gqa at step 76 of a golden prompt, sampling at temperature 1 every few
// dozen steps on the 32000-token vocabularies.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/models.h"
#include "tests/support/process.h"

namespace shardline::test {
namespace {

namespace fs = std::filesystem;

constexpr int kVocab = 32000;
constexpr int kSteps = 64;

struct Case {
  std::string dtype;
  std::string kv;  // --kv-dtype
  int tp, pp;
};

struct LayoutRun {
  std::vector<std::vector<int>> ids;  // per sequence
  std::vector<float> logits;          // (sequences, steps, vocab)
};

class LayoutRunner : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("weight_dtype_mpi_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The layout's tokens and logits for every prompt of `prompts` on `model` (default: mini-gqa's goldens).
  LayoutRun run_layout(const std::string& dtype, const std::string& kv, int tp, int pp) {
    const std::string prompts = (dir_ / "prompts").string();
    if (!fs::exists(prompts)) {
      std::ofstream out(prompts);
      for (const auto& g : load_goldens()) {
        if (g.model == "mini-gqa.bin") out << g.prompt << "\n";
      }
    }
    const std::string model = model_.empty() ? model_file("mini-gqa.bin") : model_;
    const std::string tokenizer = tokenizer_.empty() ? model_file("tokenizer.bin") : tokenizer_;
    const std::string logits = (dir_ / ("tp" + std::to_string(tp) + "pp" + std::to_string(pp) + ".logits")).string();
    const ProcessResult r = run_process(
        "mpirun --oversubscribe --bind-to none -np " + std::to_string(tp * pp) + " " + shardline_binary() +
            " run --json --threads 1 --model " + model + " --tokenizer " + tokenizer + " --prompts-file " + prompts +
            " --steps " + std::to_string(kSteps) + " --weights-dtype " + dtype + " --kv-dtype " + kv + " --tp " +
            std::to_string(tp) + " --pp " + std::to_string(pp) + " --dump-logits " + logits + extra_flags_,
        180);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    LayoutRun result;
    std::istringstream lines(r.out);
    std::string line;
    while (std::getline(lines, line)) result.ids.push_back(nlohmann::json::parse(line)["ids"].get<std::vector<int>>());
    std::ifstream in(logits, std::ios::binary);
    result.logits.resize(fs::exists(logits) ? fs::file_size(logits) / sizeof(float) : 0);
    in.read(reinterpret_cast<char*>(result.logits.data()), static_cast<std::streamsize>(result.logits.size() * sizeof(float)));
    return result;
  }

  // Runs on a model gen-model writes with shape_flags (name.bin and its tokenizer), with two prompts.
  bool generate_model(const std::string& name, const std::string& shape_flags) {
    model_ = (dir_ / (name + ".bin")).string();
    tokenizer_ = (dir_ / (name + ".tokenizer.bin")).string();
    std::ofstream(dir_ / "prompts") << "Once upon a time\nThe quick brown fox\n";
    return run_process(shardline_binary() + " gen-model " + shape_flags + " --out " + model_).exit_code == 0;
  }

  fs::path dir_;
  std::string model_, tokenizer_;  // empty: mini-gqa and the Llama 2 tokenizer
  std::string extra_flags_;         // more of run's flags (sampling, chunks)
};

class WeightDtypeLayouts : public LayoutRunner, public ::testing::WithParamInterface<Case> {};
class ExactLayouts : public LayoutRunner {};

// A layout's run against one rank's: the same tokens and the same logits, bit for bit.
void expect_one_ranks_bits(const LayoutRun& one, const LayoutRun& many, std::size_t sequences, int vocab,
                           const std::string& what) {
  ASSERT_EQ(one.ids.size(), sequences) << what;
  ASSERT_EQ(many.ids.size(), one.ids.size()) << what;
  for (std::size_t i = 0; i < one.ids.size(); ++i) EXPECT_EQ(many.ids[i], one.ids[i]) << what << ": sequence " << i;
  ASSERT_EQ(one.logits.size(), sequences * kSteps * vocab) << what;
  ASSERT_EQ(many.logits.size(), one.logits.size()) << what;
  std::size_t differing = 0;
  for (std::size_t v = 0; v < one.logits.size(); ++v) differing += std::memcmp(&one.logits[v], &many.logits[v], sizeof(float)) != 0;
  EXPECT_EQ(differing, 0u) << what << ": logits that differ from one rank's";
}

TEST_P(WeightDtypeLayouts, GiveOneRanksBits) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("mini-gqa.bin"));
  const Case& c = GetParam();
  expect_one_ranks_bits(run_layout(c.dtype, c.kv, 1, 1), run_layout(c.dtype, c.kv, c.tp, c.pp), 4, kVocab,
                        c.dtype + " + " + c.kv + " KV tp=" + std::to_string(c.tp) + " pp=" + std::to_string(c.pp));
}

// A model whose dims take int8 groups of 96 (kernels/cpu/weight_format.h): dim 576 (4.5 x 128) with heads of
// 96, so q/k/v, w1/w3 and the classifier group their k of 576 by 96 and wo, whose segments are whole heads,
// by 96 too; w2's hidden of 1536 takes 128. tp=2, 3 and 6 hold 3, 2 and 1 of its six segments.
TEST_F(ExactLayouts, Int8GroupsOf96) {
  ASSERT_TRUE(generate_model("g96", "--dim 576 --hidden 1536 --layers 2 --heads 6 --vocab 512 --seq 128"));
  const LayoutRun one = run_layout("int8", "auto", 1, 1);
  for (const int tp : {2, 3, 6}) {
    expect_one_ranks_bits(one, run_layout("int8", "auto", tp, 1), 2, 512, "group-96 model, int8 tp=" + std::to_string(tp));
  }
}

// A toy width: hidden 96 is three blocks of 32 for eight segments (kv heads), so five segments are empty and
// tp=2 ranks hold one and two blocks, and tp=4's rank 0 none (it starts the ordered sum with -0.0; before,
// such layouts all-reduced even slices and int8 flipped tokens): still one rank's order and groups, for
// every dtype.
TEST_F(ExactLayouts, AHiddenDimOfFewerBlocksThanSegments) {
  ASSERT_TRUE(generate_model("toy", "--dim 64 --hidden 96 --layers 2 --heads 8 --vocab 400 --seq 128"));
  for (const std::string dtype : {"fp32", "bf16", "int8"}) {
    const LayoutRun one = run_layout(dtype, "auto", 1, 1);
    for (const int tp : {2, 4}) {
      expect_one_ranks_bits(one, run_layout(dtype, "auto", tp, 1), 2, 400, "toy width, " + dtype + " tp=" + std::to_string(tp));
    }
  }
}

// tiny-32k: kv heads of 16 query columns (int8 and bf16 pad each to a block of 32) and a hidden dim of 172, no
// multiple of 32 (segments of blocks of 32, the last one short), sampled at temperature 1 over its 32000
// tokens, where a logit one ulp apart moved the draw of a sequence every few dozen steps; with a prompt of
// over 64 tokens in one chunk, whose products a TP rank gathers in blocks of 64 rows (runtime::kPartialRows).
TEST_F(ExactLayouts, SampledOnTinyHeadsAndAHiddenDimOfNoWhole32) {
  SHARDLINE_REQUIRE_MODEL_FILE(model_file("tiny-32k.bin"));
  model_ = model_file("tiny-32k.bin");
  std::size_t n_prompts = 0;
  {
    std::ofstream prompts(dir_ / "prompts");
    for (const auto& g : load_goldens()) {
      if (g.model != "tiny-32k.bin") continue;
      prompts << g.prompt << "\n";
      ++n_prompts;
    }
    std::string long_prompt;
    for (int i = 0; i < 12; ++i) long_prompt += "Pipeline parallel inference splits layers across ranks. ";
    prompts << long_prompt << "\n";
    ++n_prompts;
  }
  ASSERT_GT(n_prompts, 1u);
  extra_flags_ = " --temperature 1 --top-p 0.95 --seed 3 --chunk-tokens 128";
  for (const std::string dtype : {"fp32", "bf16", "int8"}) {
    const LayoutRun one = run_layout(dtype, "auto", 1, 1);
    for (const auto& [tp, pp] : {std::pair{2, 1}, std::pair{4, 1}, std::pair{2, 2}}) {
      expect_one_ranks_bits(one, run_layout(dtype, "auto", tp, pp), n_prompts, kVocab,
                            "tiny-32k sampled, " + dtype + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, WeightDtypeLayouts,
                         ::testing::Values(Case{"bf16", "auto", 2, 1}, Case{"bf16", "auto", 1, 2},
                                           Case{"bf16", "auto", 2, 2}, Case{"int8", "auto", 2, 1},
                                           Case{"int8", "auto", 1, 2}, Case{"int8", "auto", 2, 2},
                                           Case{"fp32", "fp16", 2, 1}, Case{"fp32", "fp16", 2, 2},
                                           Case{"fp32", "int8", 2, 1}, Case{"fp32", "int8", 2, 2},
                                           Case{"fp32", "fp32", 2, 2}, Case{"int8", "int8", 2, 1}),
                         [](const auto& info) {
                           return info.param.dtype + "_kv_" + info.param.kv + "_tp" + std::to_string(info.param.tp) +
                                  "_pp" + std::to_string(info.param.pp);
                         });

}  // namespace
}  // namespace shardline::test
