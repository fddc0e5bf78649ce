// The single-rank engine against the reference goldens, in-process: every golden line on both models,
// with 1 and 2 threads and several prefill chunk sizes (different summation orders must not matter).
#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "partition/mesh.h"
#include "runtime/engine.h"
#include "tests/support/models.h"

namespace shardline::runtime {
namespace {

struct EngineCase {
  int threads;
  int chunk_tokens;
};

class EngineGoldens : public ::testing::TestWithParam<EngineCase> {};

TEST_P(EngineGoldens, ReproducesEveryGoldenExactly) {
  const std::string goldens_path = test::model_file("goldens.jsonl");
  SHARDLINE_REQUIRE_MODEL_FILE(goldens_path);
  const auto goldens = test::load_goldens();
  ASSERT_EQ(goldens.size(), 8u);
  auto comm = comm::make_solo_communicator();
  for (const std::string model : {"tiny-32k.bin", "mini-gqa.bin"}) {
    SHARDLINE_REQUIRE_MODEL_FILE(test::model_file(model));
    EngineOptions options{test::model_file(model), test::model_file("tokenizer.bin"), GetParam().threads,
                          GetParam().chunk_tokens};
    Engine engine(options, partition::Mesh::single(), *comm);
    for (const auto& golden : goldens) {
      if (golden.model != model) continue;
      GenerationRequest request{golden.prompt, golden.steps, {}};
      const GenerationResult result = engine.generate(request);
      EXPECT_EQ(result.prompt_ids, golden.prompt_ids) << model << " / " << golden.prompt;
      EXPECT_EQ(result.ids, golden.ids) << model << " / " << golden.prompt;
      EXPECT_EQ(result.text, golden.run_c_text) << model << " / " << golden.prompt;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(ThreadsAndChunks, EngineGoldens,
                         ::testing::Values(EngineCase{1, 64}, EngineCase{2, 64}, EngineCase{1, 1}, EngineCase{2, 3}),
                         [](const auto& info) {
                           return "threads" + std::to_string(info.param.threads) + "_chunk" +
                                  std::to_string(info.param.chunk_tokens);
                         });

}  // namespace
}  // namespace shardline::runtime
