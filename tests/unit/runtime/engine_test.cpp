// The single-rank engine against the reference goldens, in-process: every golden line on both models,
// with 1 and 2 threads and several prefill chunk sizes (different summation orders must not matter).
#include <gtest/gtest.h>

#include "common/error.h"
#include "comm/communicator.h"
#include "partition/mesh.h"
#include "runtime/engine.h"
#include "tests/support/models.h"

namespace shardline::runtime {
namespace {

struct EngineCase {
  int threads;
  int chunk_tokens;
  int micro_batches = 1;
};

class EngineGoldens : public ::testing::TestWithParam<EngineCase> {
 protected:
  std::unique_ptr<Engine> make_engine(const std::string& model) {
    EngineOptions options;
    options.model_path = test::model_file(model);
    options.tokenizer_path = test::model_file("tokenizer.bin");
    options.threads = GetParam().threads;
    options.chunk_tokens = GetParam().chunk_tokens;
    options.micro_batches = GetParam().micro_batches;
    return std::make_unique<Engine>(options, partition::Mesh::single(), *comm_, *comm_);
  }
  std::unique_ptr<comm::Communicator> comm_ = comm::make_solo_communicator();
};

TEST_P(EngineGoldens, ReproducesEveryGoldenExactly) {
  const std::string goldens_path = test::model_file("goldens.jsonl");
  SHARDLINE_REQUIRE_MODEL_FILE(goldens_path);
  const auto goldens = test::load_goldens();
  ASSERT_EQ(goldens.size(), 8u);
  for (const std::string model : {"tiny-32k.bin", "mini-gqa.bin"}) {
    SHARDLINE_REQUIRE_MODEL_FILE(test::model_file(model));
    const auto engine = make_engine(model);
    for (const auto& golden : test::goldens_of(model)) {
      GenerationRequest request{golden.prompt, golden.steps, {}};
      const GenerationResult result = engine->generate(request);
      EXPECT_EQ(result.prompt_ids, golden.prompt_ids) << model << " / " << golden.prompt;
      EXPECT_EQ(result.ids, golden.ids) << model << " / " << golden.prompt;
      EXPECT_EQ(result.text, golden.run_c_text) << model << " / " << golden.prompt;
    }
  }
}

// All goldens of a model as one batch: rows of different sequences share forward calls (micro-batches of
// several sequences, prefill chunks next to decode tokens), and every sequence still gets its own golden.
TEST_P(EngineGoldens, BatchedSequencesEachReproduceTheirGolden) {
  const std::string goldens_path = test::model_file("goldens.jsonl");
  SHARDLINE_REQUIRE_MODEL_FILE(goldens_path);
  for (const std::string model : {"tiny-32k.bin", "mini-gqa.bin"}) {
    SHARDLINE_REQUIRE_MODEL_FILE(test::model_file(model));
    const auto engine = make_engine(model);
    const std::vector<test::Golden> expected = test::goldens_of(model);
    std::vector<GenerationRequest> requests;
    for (const auto& golden : expected) requests.push_back({golden.prompt, golden.steps, {}});
    const auto results = engine->generate(requests);
    ASSERT_EQ(results.size(), expected.size());
    for (std::size_t i = 0; i < results.size(); ++i) {
      EXPECT_EQ(results[i].ids, expected[i].ids) << model << " / " << expected[i].prompt;
      EXPECT_EQ(results[i].text, expected[i].run_c_text) << model << " / " << expected[i].prompt;
    }
  }
}

TEST(EncodeRequests, ARepeatedPromptIsEncodedOnceAndCheckedForEachRequest) {
  // run --batch N repeats one prompt N times: encoded once, each request still checked with its own steps.
  const Tokenizer tokenizer = make_synthetic_tokenizer(400);
  const std::vector<GenerationRequest> requests = {{"the tale", 4, {}}, {"a rat", 4, {}}, {"the tale", 6, {}}, {"a rat", 1, {}}};
  const std::vector<std::vector<int>> ids = encode_requests(tokenizer, 32, requests);
  ASSERT_EQ(ids.size(), requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(ids[i], encode_checked(tokenizer, 32, requests[i])) << i;
  EXPECT_EQ(ids[0], ids[2]);
  // The third request's steps do not fit though the first's, with the same prompt, did.
  const int prompt_tokens = static_cast<int>(ids[0].size());
  std::vector<GenerationRequest> too_long = requests;
  too_long[2].steps = 32 - prompt_tokens + 2;
  try {
    encode_requests(tokenizer, 32, too_long);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("sequence 3 of 4 (prompt \"the tale\"): --steps"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(ThreadsAndChunks, EngineGoldens,
                         ::testing::Values(EngineCase{1, 64}, EngineCase{2, 64}, EngineCase{1, 1}, EngineCase{2, 3},
                                           EngineCase{1, 5, 3}, EngineCase{1, 0, 2}),
                         [](const auto& info) {
                           return "threads" + std::to_string(info.param.threads) + "_chunk" +
                                  std::to_string(info.param.chunk_tokens) + "_m" +
                                  std::to_string(info.param.micro_batches);
                         });

}  // namespace
}  // namespace shardline::runtime
