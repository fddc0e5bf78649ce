// The paged KV cache in the whole engine: 300 generated tokens with 16-token blocks (19 blocks per
// sequence) equal the unpaged result exactly (a single block holding every position is the contiguous
// layout), logits bit for bit; odd block sizes and batched sequences too; a sequence the pool cannot hold
// alone is a clean ResourceError before any work; more sequences than the pool holds at once wait for
// blocks and start as others finish, with the same tokens; blocks go back to the pool after each generation.
#include <cstring>

#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "common/error.h"
#include "partition/mesh.h"
#include "runtime/engine.h"
#include "runtime/pipeline.h"
#include "tests/support/models.h"

namespace shardline::runtime {
namespace {

struct Generated {
  std::vector<int> ids;
  std::vector<float> logits;  // (steps, vocab)
};

EngineOptions options_with_blocks(int block_tokens, int kv_blocks = 0) {
  EngineOptions options;
  options.model_path = test::model_file("mini-gqa.bin");
  options.tokenizer_path = test::model_file("tokenizer.bin");
  options.threads = 1;  // the block layout, not the thread count, is under test (and 1 thread is robust to load)
  options.kv_block_tokens = block_tokens;
  options.kv_blocks = kv_blocks;
  return options;
}

Generated generate(Engine& engine, const GenerationRequest& request) {
  Generated out;
  const auto results = engine.generate({request}, {}, [&](int, int, const float* logits) {
    out.logits.insert(out.logits.end(), logits, logits + engine.shape().vocab_size);
  });
  out.ids = results.at(0).ids;
  return out;
}

TEST(PagedKv, ThreeHundredTokensWith16TokenBlocksEqualTheUnpagedResultExactly) {
  SHARDLINE_REQUIRE_MODEL_FILE(test::model_file("mini-gqa.bin"));
  auto comm = comm::make_solo_communicator();
  const GenerationRequest request{"Once upon a time", 300, {}};
  Engine unpaged_engine(options_with_blocks(512), partition::Mesh::single(), *comm, *comm);  // seq_len 512: one block
  const Generated unpaged = generate(unpaged_engine, request);
  ASSERT_EQ(unpaged.ids.size(), 300u) << "the model sampled BOS early; pick another prompt";
  EXPECT_EQ(unpaged_engine.kv_pool().peak_used_blocks(), 1);

  Engine paged_engine(options_with_blocks(16), partition::Mesh::single(), *comm, *comm);
  const Generated paged = generate(paged_engine, request);
  EXPECT_EQ(paged.ids, unpaged.ids);
  ASSERT_EQ(paged.logits.size(), unpaged.logits.size());
  EXPECT_EQ(std::memcmp(paged.logits.data(), unpaged.logits.data(), paged.logits.size() * sizeof(float)), 0)
      << "logits differ between 16-token blocks and one block";
  // 5 prompt tokens + 299 fed back = 304 positions = 19 blocks of 16, all returned afterwards.
  EXPECT_EQ(paged_engine.kv_pool().peak_used_blocks(), 19);
  EXPECT_EQ(paged_engine.kv_pool().used_blocks(), 0);
}

TEST(PagedKv, OddBlockSizesAndBatchesReproduceTheGoldens) {
  SHARDLINE_REQUIRE_MODEL_FILE(test::model_file("goldens.jsonl"));
  auto comm = comm::make_solo_communicator();
  for (int block_tokens : {1, 5, 64}) {
    for (const std::string model : {"tiny-32k.bin", "mini-gqa.bin"}) {
      SHARDLINE_REQUIRE_MODEL_FILE(test::model_file(model));
      EngineOptions options = options_with_blocks(block_tokens);
      options.model_path = test::model_file(model);
      options.micro_batches = 2;
      options.chunk_tokens = 3;
      Engine engine(options, partition::Mesh::single(), *comm, *comm);
      const std::vector<test::Golden> expected = test::goldens_of(model);
      std::vector<GenerationRequest> requests;
      for (const auto& golden : expected) requests.push_back({golden.prompt, golden.steps, {}});
      const auto results = engine.generate(requests);
      ASSERT_EQ(results.size(), expected.size());
      for (std::size_t i = 0; i < results.size(); ++i) {
        EXPECT_EQ(results[i].ids, expected[i].ids) << model << " block_tokens " << block_tokens << " / "
                                                    << expected[i].prompt;
      }
      EXPECT_EQ(engine.kv_pool().used_blocks(), 0);
    }
  }
}

TEST(PagedKv, AnExhaustedPoolIsACleanErrorBeforeAnyWork) {
  SHARDLINE_REQUIRE_MODEL_FILE(test::model_file("mini-gqa.bin"));
  auto comm = comm::make_solo_communicator();
  // 5 prompt tokens + 63 steps = 68 positions = 5 blocks of 16; the pool has 4.
  Engine engine(options_with_blocks(16, 4), partition::Mesh::single(), *comm, *comm);
  const GenerationRequest request{"Once upon a time", 64, {}};
  try {
    engine.check_kv_capacity({request});
    FAIL() << "expected ResourceError";
  } catch (const ResourceError& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-blocks 5 or more"), std::string::npos) << e.what();
  }
  EXPECT_THROW(engine.generate(request), ResourceError);
  EXPECT_EQ(engine.kv_pool().committed_blocks(), 0);  // nothing ran
  // What fits still runs, and the same engine serves it after the refusal.
  const GenerationResult fits = engine.generate({"Once upon a time", 60, {}});
  EXPECT_EQ(fits.ids.size(), 60u);
  EXPECT_EQ(engine.kv_pool().peak_used_blocks(), 4);
}

// A forward call's rows are bounded by the sequences the pool holds at once, not by every sequence given:
// thousands of prompts once sized the buffers for all of them together (about 1 MB a sequence on the 15M
// shape) however few the pool let in.
TEST(PagedKv, RowsInFlightAreBoundedByWhatThePoolHolds) {
  auto spec = [](int chunk) {
    SequenceSpec s;
    s.prompt_ids = {1, 2, 3};
    s.steps = 4;
    s.chunk_tokens = chunk;
    return s;
  };
  std::vector<SequenceSpec> specs;
  for (int chunk : {4, 4, 8, 4, 4, 4, 2, 4, 4, 4}) specs.push_back(spec(chunk));
  const std::vector<int> needs(specs.size(), 3);  // 3 blocks each
  EXPECT_EQ(Pipeline::max_rows_for(PipelineOptions{1}, specs), 42);  // every chunk at once
  // A pool of 7 blocks holds two sequences at once: the two largest chunks.
  EXPECT_EQ(Pipeline::max_rows_for(PipelineOptions{1}, specs, needs, 7), 8 + 4);
  EXPECT_EQ(Pipeline::max_rows_for(PipelineOptions{1}, specs, needs, 1000), 42);
  // A pool smaller than any sequence still runs them one at a time (the engine refuses it before).
  EXPECT_EQ(Pipeline::max_rows_for(PipelineOptions{1}, specs, needs, 2), 8);
  // Micro-batches 2: sequences 0, 2, 4, 6, 8 and 1, 3, ...; the smallest needs count first.
  std::vector<int> mixed = {1, 3, 1, 3, 5, 3, 1, 3, 5, 3};
  EXPECT_EQ(Pipeline::max_rows_for(PipelineOptions{2}, specs, mixed, 3), 8 + 4 + 4);  // group 0: three of need 1
}

TEST(PagedKv, SequencesBeyondThePoolWaitForBlocksAndGiveTheSameTokensAndLogits) {
  SHARDLINE_REQUIRE_MODEL_FILE(test::model_file("mini-gqa.bin"));
  auto comm = comm::make_solo_communicator();
  // Each request: 5 prompt tokens + 63 steps = 5 blocks of 16. A 12-block pool holds two at once; the
  // sampled ones may stop early at BOS and make room sooner.
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r{"Once upon a time", 64, {}};
    r.sampler.temperature = i % 2 == 0 ? 0.0f : 0.9f;  // greedy and sampled sequences alike
    r.sampler.seed = 100 + i;
    requests.push_back(r);
  }
  auto run = [&](int kv_blocks, int micro_batches) {
    EngineOptions options = options_with_blocks(16, kv_blocks);
    options.micro_batches = micro_batches;
    Engine engine(options, partition::Mesh::single(), *comm, *comm);
    std::vector<std::vector<float>> logits(requests.size());
    const auto results = engine.generate(requests, {}, [&](int i, int, const float* l) {
      logits.at(i).insert(logits[i].end(), l, l + engine.shape().vocab_size);
    });
    EXPECT_LE(engine.kv_pool().peak_used_blocks(), kv_blocks);
    EXPECT_EQ(engine.kv_pool().used_blocks(), 0);
    return std::make_tuple(results, logits, engine.kv_pool().peak_used_blocks());
  };
  const auto [together, together_logits, together_peak] = run(64, 1);
  EXPECT_GT(together_peak, 12) << "the unconstrained run must need more than the small pool";
  for (int micro_batches : {1, 2}) {
    const auto [waited, waited_logits, peak] = run(12, micro_batches);
    ASSERT_EQ(waited.size(), together.size());
    for (std::size_t i = 0; i < together.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "sequence " << i << ", m=" << micro_batches);
      EXPECT_EQ(waited[i].ids, together[i].ids);
      EXPECT_EQ(waited[i].text, together[i].text);
      EXPECT_EQ(waited_logits[i], together_logits[i]);
      if (i % 2 == 0) {
        EXPECT_EQ(waited[i].ids.size(), 64u) << "greedy";
      }
    }
  }
}

}  // namespace
}  // namespace shardline::runtime
